"""An office's first mail reads (or makes) its signing key in a thread: the key file's fsync
never stalls the event loop that every other delivery waits on (bench.probot_compare), and the
key that signs is still that office's own."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from bot.mail.header import parse_mail_body
from bot.mail.signing import Keyring, KeyringError, Keyrings
from tests.support import Actor

SCOUT_VAULT = "acme/scout-vault"


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool]]:
    """Each load_or_create: (file name, whether on the calling test's own thread)."""
    calls: list[tuple[str, bool]] = []
    load = Keyring.load_or_create.__func__  # type: ignore[attr-defined]
    main = threading.get_ident()

    def counted(cls: type[Keyring], path: str | Path, /, *args: Any, **kw: Any) -> Keyring:
        calls.append((Path(path).name, threading.get_ident() == main))
        return load(cls, path, *args, **kw)  # type: ignore[no-any-return]

    monkeypatch.setattr(Keyring, "load_or_create", classmethod(counted))
    return calls


async def test_prepare_makes_an_office_key_in_a_thread_then_for_office_has_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting(monkeypatch)
    rings = Keyrings.in_data_dir(tmp_path)
    await rings.prepare("Acme")
    await rings.prepare("acme")  # at hand: nothing read again
    assert calls == [("acme.json", False)]
    kid, _ = rings.for_office("acme").sign(b"x")
    assert kid.startswith("vm-acme-") and calls == [("acme.json", False)]
    assert (tmp_path / "signing-keys" / "acme.json").exists()
    other = Keyrings.in_data_dir(tmp_path)  # another process: the same key, read in a thread
    await other.prepare("acme")
    assert other.for_office("acme").active_kid == rings.for_office("acme").active_kid
    with pytest.raises(KeyringError):
        await rings.prepare("../evil")
    await Keyrings.ephemeral().prepare("acme")  # in memory: nothing to read


async def test_a_new_offices_first_mail_is_signed_with_a_key_made_off_the_loop(
        embedded: Any, person: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    keyring: Keyrings = embedded.services.keyring
    keyring._rings.pop("acme", None)  # as on a deployment's first mail of the office
    assert keyring._dir is not None
    (keyring._dir / "acme.json").unlink(missing_ok=True)
    calls = _counting(monkeypatch)
    marco: Actor = person("marco")
    issue = await marco.open_issue(SCOUT_VAULT, "Numbers", "Q3 numbers?")
    await embedded.settle()
    found = await marco.issue(SCOUT_VAULT, issue["number"])
    header, _ = parse_mail_body(found["body"])
    assert header is not None and header.key_id == keyring.for_office("acme").active_kid
    assert header.key_id.startswith("vm-acme-")
    assert calls == [("acme.json", False)], "made once, and not on the event loop's thread"


async def test_the_key_is_made_off_the_loop_before_the_replica_knows_the_installation(
        embedded: Any, person: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """An org that installed the App a moment ago: its first mail can come before this replica
    heard of the installation (its `installation` delivery is another's, or still queued: the
    delivery names the installation it came through). The key is made in a thread all the
    same (bench.probot_compare's cells are such orgs: a key synced to disk on the event loop
    for each)."""
    keyring: Keyrings = embedded.services.keyring
    keyring._rings.pop("acme", None)
    assert keyring._dir is not None
    (keyring._dir / "acme.json").unlink(missing_ok=True)
    monkeypatch.delitem(embedded.services.installations, "acme")
    calls = _counting(monkeypatch)
    marco: Actor = person("marco")
    issue = await marco.open_issue(SCOUT_VAULT, "Numbers", "Q3 numbers?")
    await embedded.settle()
    header, _ = parse_mail_body((await marco.issue(SCOUT_VAULT, issue["number"]))["body"])
    assert header is not None and header.key_id == keyring.for_office("acme").active_kid
    assert calls == [("acme.json", False)], "made once, and not on the event loop's thread"
