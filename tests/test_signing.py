"""Signing keys: persistence, rotation, published keys."""

from __future__ import annotations

import json
import os
import re
import stat
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bot.mail.signing import KEYS_FILE_NAME, Keyring, KeyringError, PublicKeys, b64url_decode

DATA = b"vaultmail-header-v1\n{}"


def test_load_or_create_writes_a_private_file(tmp_path: Path) -> None:
    path = tmp_path / "data" / KEYS_FILE_NAME
    ring = Keyring.load_or_create(path, now=datetime(2025, 1, 31, tzinfo=UTC))
    assert path.exists()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert re.fullmatch(r"vm-20250131-[0-9a-f]{6}", ring.active_kid)
    doc = json.loads(path.read_text())
    assert doc["active"] == ring.active_kid and len(doc["keys"]) == 1


def test_load_or_create_loads_the_same_keys(tmp_path: Path) -> None:
    path = tmp_path / KEYS_FILE_NAME
    first = Keyring.load_or_create(path)
    kid, sig = first.sign(DATA)
    second = Keyring.load_or_create(path)
    assert second.active_kid == kid
    assert second.verify(kid, DATA, sig)
    assert Keyring.in_data_dir(tmp_path).active_kid == kid


def test_loose_permissions_are_tightened(tmp_path: Path) -> None:
    path = tmp_path / KEYS_FILE_NAME
    Keyring.load_or_create(path)
    os.chmod(path, 0o644)
    Keyring.load_or_create(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_corrupt_key_file_is_an_error_not_overwritten(tmp_path: Path) -> None:
    path = tmp_path / KEYS_FILE_NAME
    path.write_text("{not json")
    with pytest.raises(KeyringError, match="cannot read signing keys"):
        Keyring.load_or_create(path)
    assert path.read_text() == "{not json"


def test_sign_and_verify() -> None:
    ring = Keyring.ephemeral()
    kid, sig = ring.sign(DATA)
    assert kid == ring.active_kid
    assert len(b64url_decode(sig)) == 64 and "=" not in sig
    assert ring.verify(kid, DATA, sig)
    assert not ring.verify(kid, DATA + b"x", sig)
    assert not ring.verify("vm-unknown", DATA, sig)
    assert not ring.verify(kid, DATA, "not base64!")
    assert not ring.verify(kid, DATA, sig[:-4])


def test_rotation_keeps_old_signatures_verifying(tmp_path: Path) -> None:
    path = tmp_path / KEYS_FILE_NAME
    ring = Keyring.load_or_create(path)
    old_kid, old_sig = ring.sign(DATA)
    new_kid = ring.rotate()
    assert new_kid != old_kid and ring.active_kid == new_kid
    assert ring.sign(DATA)[0] == new_kid
    assert ring.verify(old_kid, DATA, old_sig)
    reloaded = Keyring.load_or_create(path)
    assert reloaded.active_kid == new_kid
    assert reloaded.key_ids == [old_kid, new_kid]
    assert reloaded.verify(old_kid, DATA, old_sig)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_running_app_sees_a_rotation_made_by_another_process(tmp_path: Path) -> None:
    path = tmp_path / KEYS_FILE_NAME
    app = Keyring.load_or_create(path)
    cli = Keyring.load_or_create(path)
    new_kid = cli.rotate()
    assert app.sign(DATA)[0] == new_kid
    assert [k["kid"] for k in app.public_jwks()["keys"] if k["active"]] == [new_kid]


def test_public_jwks_shape() -> None:
    ring = Keyring.ephemeral()
    old = ring.active_kid
    new = ring.rotate()
    jwks = ring.public_jwks()
    assert json.loads(json.dumps(jwks)) == jwks
    by_kid = {k["kid"]: k for k in jwks["keys"]}
    assert set(by_kid) == {old, new}
    for key in jwks["keys"]:
        assert key["kty"] == "OKP" and key["crv"] == "Ed25519"
        assert len(b64url_decode(key["x"])) == 32
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z", key["created"])
        assert "d" not in key  # never the private part
    assert by_kid[new]["active"] is True and by_kid[old]["active"] is False


def test_jwks_round_trip_verifies_with_published_keys_only() -> None:
    ring = Keyring.ephemeral()
    old_kid, old_sig = ring.sign(DATA)
    ring.rotate()
    new_kid, new_sig = ring.sign(DATA)
    published = PublicKeys.from_jwks(json.loads(json.dumps(ring.public_jwks())))
    assert published.active_kid == new_kid
    assert published.has_key(old_kid) and published.has_key(new_kid)
    assert published.verify(old_kid, DATA, old_sig)
    assert published.verify(new_kid, DATA, new_sig)
    assert not published.verify(new_kid, DATA, old_sig)
    assert not published.verify("vm-x", DATA, new_sig)
    again = PublicKeys.from_jwks(published.to_jwks())
    assert again.verify(old_kid, DATA, old_sig)


def test_published_keys_of_another_office_do_not_verify() -> None:
    ring, other = Keyring.ephemeral(), Keyring.ephemeral()
    kid, sig = ring.sign(DATA)
    jwks = other.public_jwks()
    jwks["keys"][0]["kid"] = kid  # same id, different key
    assert not PublicKeys.from_jwks(jwks).verify(kid, DATA, sig)


def test_from_jwks_skips_other_key_types_and_rejects_broken_ones() -> None:
    ring = Keyring.ephemeral()
    jwks = ring.public_jwks()
    jwks["keys"].append({"kid": "rsa", "kty": "RSA", "n": "x", "e": "AQAB"})
    assert PublicKeys.from_jwks(jwks).key_ids == [ring.active_kid]
    with pytest.raises(KeyringError, match="bad public key"):
        PublicKeys.from_jwks({"keys": [{"kid": "k", "kty": "OKP", "crv": "Ed25519", "x": "AAA"}]})
    with pytest.raises(KeyringError):
        PublicKeys.from_jwks({"nope": []})
    with pytest.raises(KeyringError):
        PublicKeys.from_jwks([])


def test_sign_with_an_unknown_key_id_fails() -> None:
    with pytest.raises(KeyringError):
        Keyring.ephemeral().sign(DATA, kid="vm-nope")
