"""Signing keys: persistence, rotation, published keys."""

from __future__ import annotations

import json
import os
import re
import stat
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bot.mail.signing import (
    KEYS_FILE_NAME,
    OFFICE_KEYS_DIR,
    Keyring,
    KeyringError,
    Keyrings,
    PublicKeys,
    b64url_decode,
)

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


# -- one keyring per office (issue 21) ---------------------------------------------------------


def test_each_office_gets_its_own_private_key_file_whose_key_ids_name_it(tmp_path: Path) -> None:
    rings = Keyrings.in_data_dir(tmp_path)
    assert rings.offices() == [], "nothing is made before an office signs"
    acme = rings.for_office("Acme")  # org logins are case-insensitive: the office is lowercase
    assert re.fullmatch(r"vm-acme-\d{8}-[0-9a-f]{6}", acme.active_kid)
    assert acme.office == "acme" and rings.for_office("acme") is acme
    path = tmp_path / OFFICE_KEYS_DIR / "acme.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text())["office"] == "acme"
    evil = rings.for_office("evil")
    assert evil.active_kid.startswith("vm-evil-") and evil.active_kid != acme.active_kid
    assert rings.offices() == ["acme", "evil"]
    assert Keyrings.in_data_dir(tmp_path).for_office("acme").active_kid == acme.active_kid
    assert not (tmp_path / KEYS_FILE_NAME).exists(), "no legacy keyring is made"


def test_an_office_name_is_an_org_login_and_nothing_else(tmp_path: Path) -> None:
    rings = Keyrings.in_data_dir(tmp_path)
    for bad in ("../acme", "acme/x", "", "-acme", ".acme", "a" * 41):
        with pytest.raises(KeyringError, match="not an organisation login"):
            rings.for_office(bad)
    assert not (tmp_path / OFFICE_KEYS_DIR).exists() or rings.offices() == []
    # Gitea's and Forgejo's org names may hold dots and underscores
    assert rings.for_office("acme_corp.eu").active_kid.startswith("vm-acme_corp.eu-")


def test_a_key_file_of_another_office_is_refused(tmp_path: Path) -> None:
    rings = Keyrings.in_data_dir(tmp_path)
    rings.for_office("evil")
    folder = tmp_path / OFFICE_KEYS_DIR
    (folder / "acme.json").write_bytes((folder / "evil.json").read_bytes())
    with pytest.raises(KeyringError, match="office 'evil', not 'acme'"):
        Keyrings.in_data_dir(tmp_path).for_office("acme")


def test_the_verifier_knows_which_office_each_key_speaks_for(tmp_path: Path) -> None:
    app = Keyrings.in_data_dir(tmp_path)
    kid, sig = app.for_office("evil").sign(DATA)
    cli = Keyrings.in_data_dir(tmp_path)  # another process: reads what the app made
    assert cli.has_key(kid) and cli.verify(kid, DATA, sig)
    assert cli.speaks_for(kid) == ("evil",)
    stranger = "vm-nobody-20261204-3fa9c2"
    assert not cli.has_key(stranger) and cli.speaks_for(stranger) == ()
    assert "nobody" not in cli.offices(), "verifying never makes an office's keys"


def test_rotation_is_per_office_and_seen_by_every_process(tmp_path: Path) -> None:
    app, cli = Keyrings.in_data_dir(tmp_path), Keyrings.in_data_dir(tmp_path)
    old_acme, old_evil = app.for_office("acme").active_kid, app.for_office("evil").active_kid
    new_acme = cli.for_office("acme").rotate()
    assert new_acme.startswith("vm-acme-") and new_acme != old_acme
    assert app.for_office("acme").sign(DATA)[0] == new_acme
    assert app.for_office("evil").active_kid == old_evil, "another office's key is untouched"
    assert app.has_key(old_acme), "the old key keeps verifying"



def test_an_office_key_file_is_read_once_and_each_office_signs_with_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # every mail signs: the keyring of its office is kept, never read (or made) per signature
    reads: list[str] = []
    load = Keyring.load_or_create.__func__  # type: ignore[attr-defined]

    def counted(cls: type[Keyring], path: str | Path, /, *args: object,
                **kw: object) -> Keyring:
        reads.append(Path(path).name)
        return load(cls, path, *args, **kw)  # type: ignore[no-any-return]

    monkeypatch.setattr(Keyring, "load_or_create", classmethod(counted))
    app, cli = Keyrings.in_data_dir(tmp_path), Keyrings.in_data_dir(tmp_path)
    for _ in range(5):
        for office in ("acme", "evil", "acme-labs"):
            kid, signature = app.for_office(office).sign(DATA)
            assert kid.startswith(f"vm-{office}-2")  # its own key, never a neighbour's
            assert app.verify(kid, DATA, signature) and app.speaks_for(kid) == (office,)
    assert sorted(reads) == ["acme-labs.json", "acme.json", "evil.json"]
    rotated = cli.for_office("acme").rotate()  # another process rotates one office's key
    assert app.for_office("acme").sign(DATA)[0] == rotated, "the kept keyring sees it"
    assert app.for_office("acme-labs").sign(DATA)[0] != rotated
    assert reads.count("acme.json") == 2  # (the rotating process's own read)

def test_each_office_publishes_only_its_own_keys_and_the_union_has_them_all(
        tmp_path: Path) -> None:
    rings = Keyrings.in_data_dir(tmp_path)
    acme, evil = rings.for_office("acme"), rings.for_office("evil")
    acme.rotate()
    own = rings.public_jwks("acme")
    assert {k["kid"] for k in own["keys"]} == set(acme.key_ids)
    assert {k["office"] for k in own["keys"]} == {"acme"}
    union = rings.public_jwks()
    assert {k["kid"] for k in union["keys"]} == set(acme.key_ids) | set(evil.key_ids)
    published = PublicKeys.from_jwks(json.loads(json.dumps(union)))
    kid, sig = evil.sign(DATA)
    assert published.verify(kid, DATA, sig) and published.speaks_for(kid) == ("evil",)
    assert not PublicKeys.from_jwks(own).has_key(kid)


def test_the_legacy_keyring_verifies_signs_nothing_and_is_bound_to_the_offices_it_served(
        tmp_path: Path) -> None:
    legacy = Keyring.load_or_create(tmp_path / KEYS_FILE_NAME)  # from before offices had keys
    kid, sig = legacy.sign(DATA)
    rings = Keyrings.in_data_dir(tmp_path, installed=lambda: ["Acme"])
    assert rings.verify(kid, DATA, sig)
    assert rings.speaks_for(kid) == ("acme",), "the one office it served"
    assert json.loads((tmp_path / KEYS_FILE_NAME).read_text())["offices"] == ["acme"]
    assert stat.S_IMODE((tmp_path / KEYS_FILE_NAME).stat().st_mode) == 0o600
    assert rings.for_office("acme").active_kid != kid, "new mail is signed with acme's own key"
    later = Keyrings.in_data_dir(tmp_path, installed=lambda: ["acme", "evil"])
    assert later.speaks_for(kid) == ("acme",), "an office installed later never gets it"
    by_kid = {k["kid"]: k for k in later.public_jwks("acme")["keys"]}
    assert by_kid[kid]["legacy"] is True and by_kid[kid]["active"] is False
    assert kid not in {k["kid"] for k in later.public_jwks("evil")["keys"]}
    assert PublicKeys.from_jwks(later.public_jwks()).speaks_for(kid) == ("acme",)


def test_a_legacy_keyring_not_bound_yet_speaks_for_any_office(tmp_path: Path) -> None:
    legacy = Keyring.load_or_create(tmp_path / KEYS_FILE_NAME)
    rings = Keyrings.in_data_dir(tmp_path)  # nothing installed yet: nothing to bind it to
    assert rings.speaks_for(legacy.active_kid) is None
    assert "offices" not in json.loads((tmp_path / KEYS_FILE_NAME).read_text())


def test_processes_making_an_office_key_at_once_agree_on_one(tmp_path: Path) -> None:
    import subprocess
    import sys

    script = ("import sys; from bot.mail.signing import Keyrings; "
              "print(Keyrings.in_data_dir(sys.argv[1]).for_office('acme').active_kid)")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True) for _ in range(4)]
    kids = {proc.communicate(timeout=60)[0].strip() for proc in procs}
    assert len(kids) == 1 and next(iter(kids)).startswith("vm-acme-")
    assert len(json.loads((tmp_path / OFFICE_KEYS_DIR / "acme.json").read_text())["keys"]) == 1


def test_a_record_of_an_office_is_signed_with_its_key_and_one_of_no_office_with_the_legacy_key(
        tmp_path: Path) -> None:
    rings = Keyrings.in_data_dir(tmp_path)
    assert rings.signer_for("Acme") is rings.for_office("acme")
    with pytest.raises(KeyringError, match="no legacy keyring"):
        rings.signer_for(None)
    legacy = Keyring.load_or_create(tmp_path / KEYS_FILE_NAME)
    assert Keyrings.in_data_dir(tmp_path).signer_for(None).active_kid == legacy.active_kid


def test_a_key_revoked_by_one_replica_is_gone_from_every_other(tmp_path: Path) -> None:
    """Replicas share the data directory: one that has the key loaded (and verified with it)
    neither trusts nor publishes it once another process revoked it; the signing key is never
    revoked."""
    from bot.mail.header import render_mail_body, sign_header, verify_mail

    app, cli = Keyrings.in_data_dir(tmp_path), Keyrings.in_data_dir(tmp_path)
    leaked = app.for_office("acme").active_kid
    header = sign_header(keyring=app.for_office("acme"), from_principal="human:a@acme.test",
                         to_principal="agent:scout", vault="acme/scout-vault", subject="Hi",
                         body="x")
    body = render_mail_body(header, "x")
    assert verify_mail(header.subject, body, "acme/scout-vault", app).valid
    with pytest.raises(KeyringError, match="is the active key"):
        cli.for_office("acme").revoke(leaked)
    new = cli.for_office("acme").rotate()
    cli.for_office("acme").revoke(leaked)
    with pytest.raises(KeyringError, match="already revoked"):
        cli.for_office("acme").revoke(leaked)
    assert not app.has_key(leaked) and app.revoked(leaked)
    assert [k["kid"] for k in app.public_jwks("acme")["keys"]] == [new]
    assert leaked not in PublicKeys.from_jwks(app.public_jwks()).key_ids
    verdict = verify_mail(header.subject, body, "acme/scout-vault", app)
    assert not verdict.valid and f"signed with revoked key {leaked}" in verdict.reason
    assert app.for_office("acme").sign(DATA)[0] == new
    doc = json.loads((tmp_path / OFFICE_KEYS_DIR / "acme.json").read_text())
    assert [k["kid"] for k in doc["keys"]] == [new], "its private key is deleted"
    assert [r["kid"] for r in doc["revoked"]] == [leaked]
