"""Ed25519 signing keys for mail headers and signed POSTs (DESIGN §3.4), one keyring per office.

One deployment serves every org that installs the App, each org an office, and each office
signs with keys of its own (issue 21), so that nothing one office signs can pass for another's.
``Keyrings`` holds them all: ``for_office(org)`` is that office's ``Keyring``, made at its
first signature (or just before it, off the event loop: ``prepare``) as
``signing-keys/<org>.json`` in the data directory (mode 0600, created and rotated under a file
lock, so the app, its replicas and the CLI agree on one key). One key
of a keyring is active and signs; older ones stay for verifying after ``rotate()``, until
``revoke()`` (a leaked key): its private key is deleted and its id recorded as revoked, so it
is neither published nor trusted any more. Every process reads the file again when it changed
(one stat, at each signature, verification and publication), so a key revoked on one replica
(the data directory is on the volume the replicas share) is revoked on all at their next use.

Key ids name their office: ``vm-acme-20261204-3fa9c2`` (``vm-``, the org's login in lower
case, the creation date, six random hex digits). Signatures are raw 64-byte Ed25519
signatures in base64url without padding.

**The legacy keyring.** Before offices had keys, one ``signing-keys.json`` signed for the
whole deployment (key ids ``vm-20250131-3fa9c2``). It is never made anew and signs no new mail
(only what was written before offices had keys: a ledger entry of no office sent to a webhook,
``Keyrings.signer_for``), but its keys verify the mail they signed, for the offices they
served: those installed when this version first needs to know (usually the deployment's one
office), recorded in that file as ``"offices"`` once and kept, so an org installed later never
gets them. Until then (nothing installed yet) they verify for any office, as they did. A
leaked legacy key is revoked as an office's is (``vaultmail keys revoke``; its active one after
``vaultmail keys rotate --legacy``).

**Verifying** (``Verifier``) asks which offices a key speaks for (``speaks_for``): an office's
key speaks for that office alone, a legacy key for the offices it served. ``Keyrings`` verifies
with every office's keys (read from the data directory as needed: another process may have
made them) and the legacy ones; ``PublicKeys`` with only the published ones.

The published document (a JWK set, RFC 8037 OKP keys): ``GET
/.well-known/vaultmail-keys/<org>.json`` (or ``...keys.json?org=<org>``) holds one office's keys
and the legacy keys that served it; ``GET /.well-known/vaultmail-keys.json`` holds them all
(the operator's, once an operator's token is set: it lists every office)::

    {"keys": [{"kid": "vm-acme-...", "kty": "OKP", "crv": "Ed25519", "x": "<b64url>",
               "use": "sig", "alg": "EdDSA", "active": true, "created": "2026-12-04T09:00:00Z",
               "office": "acme"},
              {"kid": "vm-2025...", ..., "active": false, "legacy": true, "offices": ["acme"]}]}

The private files::

    {"version": 1, "office": "acme", "active": "vm-acme-...",
     "keys": [{"kid": "vm-acme-...", "created": "...Z", "private": "<b64url raw 32 bytes>"}],
     "revoked": [{"kid": "vm-acme-...", "revoked": "...Z"}]}          (once a key is revoked)
    {"version": 1, "active": "vm-2025...", "offices": ["acme"], "keys": [...]}   (legacy)
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import os
import re
import secrets
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from bot.names import OFFICE, RULE, is_name
from bot.private_files import write_private

try:  # POSIX: serialise creation and rotation between processes (app and CLI)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

KEYS_FILE_NAME = "signing-keys.json"  # the legacy keyring: verifies, signs nothing new
OFFICE_KEYS_DIR = "signing-keys"  # one file per office: signing-keys/<org>.json
# each office's email secrets (bot.email.keys): its DKIM key and its Message-ID digest's key,
# dkim/<org>.pem and dkim/<org>.ids; they follow the office as its signing keys do
MAIL_KEYS_DIR = "dkim"
MAIL_KEY_SUFFIXES = (".pem", ".ids")
_FILE_VERSION = 1
log = logging.getLogger("vaultmail.keys")
# an office's name: its org's login, lower case (bot.names: never a path)
_OFFICE_RE = re.compile(OFFICE)
_OFFICE_KID_RE = re.compile(rf"^vm-({OFFICE})-\d{{8}}-[0-9a-f]{{6}}$")


class KeyringError(ValueError):
    """A key file or key document that cannot be used; the message says which and why."""


class Verifier(Protocol):
    """Anything that can check a signature by key id: Keyrings, a Keyring or PublicKeys."""

    def has_key(self, kid: str) -> bool: ...

    def verify(self, kid: str, data: bytes, signature: str) -> bool: ...

    def revoked(self, kid: str) -> bool:
        """Whether ``kid`` was revoked (then it is not among its keys); False when it cannot
        tell (published keys name no revoked key)."""
        ...

    def speaks_for(self, kid: str) -> tuple[str, ...] | None:
        """The offices whose word key ``kid`` is: one for an office's key, those a legacy key
        served; None for a key of no office (a legacy key not bound yet, or a keyring made
        for no office): any; () for a key it does not have."""
        ...

    def vault_now(self, kid: str, vault: str) -> str:
        """The name that the vault ``vault``, as key ``kid``'s office signed for it, has now:
        renamed with its office, or by itself, since (``Keyring.renamed``); ``vault`` itself
        when neither was, or the key is no office's."""
        ...


class Signer(Protocol):
    @property
    def active_kid(self) -> str: ...

    @property
    def office(self) -> str | None:
        """The office it signs for (None: a keyring of no office, from before offices)."""
        ...

    def sign(self, data: bytes, *, kid: str | None = None) -> tuple[str, str]: ...


def office_name(org: str) -> str:
    """An org's login as an office's name (lower case); KeyringError for anything else, so a
    name from a URL or a header never becomes a path elsewhere."""
    office = org.strip().lower() if isinstance(org, str) else ""
    if not is_name(office):
        raise KeyringError(f"{org!r} is not an organisation login ({RULE})")
    return office


def _is_office(org: str) -> bool:
    try:
        office_name(org)
    except KeyringError:
        return False
    return True


def vault_office(vault: str) -> str:
    """The office a vault (``owner/repo``) belongs to: its owner, lower case."""
    return vault.split("/", 1)[0].strip().lower()


def kid_office(kid: str) -> str | None:
    """The office a key id names by its form (``vm-<office>-<date>-<hex>``); None for a legacy
    id. Only a name: which office a key speaks for is what the keyring holding it says."""
    m = _OFFICE_KID_RE.match(kid)
    return m.group(1) if m else None


# -- encoding helpers --------------------------------------------------------------------------


def b64url_encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    """Decode base64url with or without padding; raises ValueError on anything else."""
    if not isinstance(text, str) or not text.isascii():
        raise ValueError("not base64url")
    stripped = text.rstrip("=")
    if any(c in "+/" for c in stripped):
        raise ValueError("not base64url")
    try:
        return base64.urlsafe_b64decode(stripped + "=" * (-len(stripped) % 4))
    except (binascii.Error, ValueError) as exc:
        raise ValueError("not base64url") from exc


def _iso(ts: datetime) -> str:
    return ts.astimezone(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_iso(text: str) -> datetime:
    ts = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)


def new_key_id(now: datetime | None = None, office: str | None = None) -> str:
    now = now or datetime.now(UTC)
    named = f"{office}-" if office else ""
    return f"vm-{named}{now.astimezone(UTC):%Y%m%d}-{secrets.token_hex(3)}"


def _verify_with(public: Ed25519PublicKey, data: bytes, signature: str) -> bool:
    try:
        raw = b64url_decode(signature)
    except ValueError:
        return False
    if len(raw) != 64:
        return False
    try:
        public.verify(raw, data)
    except InvalidSignature:
        return False
    return True


def _public_jwk(
    kid: str, public: Ed25519PublicKey, active: bool, created: datetime, *,
    office: str | None = None, served: tuple[str, ...] | None = None, legacy: bool = False,
    renamed: dict[str, str] | None = None,
) -> dict[str, Any]:
    jwk: dict[str, Any] = {
        "kid": kid,
        "kty": "OKP",
        "crv": "Ed25519",
        "x": b64url_encode(public.public_bytes(Encoding.Raw, PublicFormat.Raw)),
        "use": "sig",
        "alg": "EdDSA",
        "active": active,
        "created": _iso(created),
    }
    if office is not None:
        jwk["office"] = office
    if legacy:
        jwk["legacy"] = True
    if office is None and served is not None:
        jwk["offices"] = list(served)
    if office is not None and renamed:
        jwk["renamed"] = dict(sorted(renamed.items()))
    return jwk


# -- private keys ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SigningKey:
    kid: str
    created: datetime
    private: Ed25519PrivateKey

    @property
    def public(self) -> Ed25519PublicKey:
        return self.private.public_key()

    @classmethod
    def generate(cls, now: datetime | None = None, office: str | None = None) -> SigningKey:
        now = (now or datetime.now(UTC)).astimezone(UTC).replace(microsecond=0)
        return cls(new_key_id(now, office), now, Ed25519PrivateKey.generate())


class Keyring:
    """One office's signing keys (or the legacy keyring, of no office). Create with
    ``load_or_create(path)`` (persisted) or ``ephemeral()`` (in memory, for tests and the
    demo); ``Keyrings.for_office`` makes each office's."""

    def __init__(self, keys: list[SigningKey], active: str, path: Path | None = None, *,
                 office: str | None = None, served: Iterable[str] | None = None,
                 revoked: dict[str, datetime] | None = None,
                 renamed: dict[str, str] | None = None,
                 renamed_keys: dict[str, list[str]] | None = None) -> None:
        if not keys:
            raise KeyringError("a keyring needs at least one key")
        by_kid = {k.kid: k for k in keys}
        if len(by_kid) != len(keys):
            raise KeyringError("duplicate key ids in keyring")
        if active not in by_kid:
            raise KeyringError(f"active key {active!r} is not in the keyring")
        self._office = office_name(office) if office is not None else None
        self._renamed = _renamed(renamed) if self._office is not None else {}
        self._taken = _taken(renamed_keys, self._renamed)
        if self._office is not None:
            names = {self._office, *former_offices(self._renamed)}
            foreign = [k for k in by_kid if kid_office(k) not in names]
            if foreign:
                raise KeyringError(f"office {self._office}'s keyring holds keys not named for "
                                   f"it: {', '.join(foreign)}")
        self._keys = by_kid
        self._active = active
        self._path = path
        self._served = _served(served)
        self._revoked = dict(revoked or {})  # key id -> when; never in _keys again
        self._stamp: tuple[int, int, int] | None = None

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def ephemeral(cls, now: datetime | None = None, *, office: str | None = None) -> Keyring:
        office = office_name(office) if office is not None else None
        key = SigningKey.generate(now, office)
        return cls([key], key.kid, office=office)

    @classmethod
    def in_data_dir(cls, data_dir: str | Path) -> Keyring:
        """The legacy keyring of a data directory, made when absent (tests and tools only:
        the app never makes one, see ``Keyrings``)."""
        return cls.load_or_create(Path(data_dir) / KEYS_FILE_NAME)

    @classmethod
    def load_or_create(cls, path: str | Path, now: datetime | None = None, *,
                       office: str | None = None) -> Keyring:
        """Load the key file at ``path``, creating it with one fresh key when it is absent;
        with ``office``, it must be that office's. A file that exists but cannot be read (or
        is another office's) is an error, never overwritten."""
        path = Path(path)
        office = office_name(office) if office is not None else None
        path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(path):
            if not path.exists():
                key = SigningKey.generate(now, office)
                ring = cls([key], key.kid, path, office=office)
                ring._write()
                return ring
            return cls._read(path, office)

    @classmethod
    def _read(cls, path: Path, office: str | None = None) -> Keyring:
        try:
            st = path.stat()
            if st.st_mode & 0o077:
                os.chmod(path, 0o600)
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise KeyringError(f"{path}: cannot read signing keys: {exc}") from exc
        keys, active = _keys_from_doc(doc, str(path))
        revoked = _revoked_from_doc(doc, str(path))
        found = doc.get("office")
        if found != office:  # a file copied or renamed into the wrong place signs for no one
            raise KeyringError(f"{path}: holds the keys of office {found!r}, not {office!r}")
        try:
            ring = cls(keys, active, path, office=office, served=doc.get("offices"),
                       revoked=revoked, renamed=doc.get("renamed"),
                       renamed_keys=doc.get("renamed_keys"))
        except (KeyringError, TypeError) as exc:
            raise KeyringError(f"{path}: {exc}") from exc
        ring._stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        return ring

    # -- persistence -------------------------------------------------------------------------
    def _doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"version": _FILE_VERSION}
        if self._office is not None:
            doc["office"] = self._office
        if self._served is not None:
            doc["offices"] = list(self._served)
        if self._renamed:
            doc["renamed"] = dict(sorted(self._renamed.items()))
        if self._taken:
            doc["renamed_keys"] = dict(sorted(self._taken.items()))
        return doc | {
            "active": self._active,
            "keys": [
                {
                    "kid": k.kid,
                    "created": _iso(k.created),
                    "private": b64url_encode(
                        k.private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
                    ),
                }
                for k in self._keys.values()
            ],
        } | ({"revoked": [{"kid": kid, "revoked": _iso(when)}
                          for kid, when in self._revoked.items()]} if self._revoked else {})

    def _write(self) -> None:
        if self._path is None:
            return
        write_private(self._path, json.dumps(self._doc(), indent=2) + "\n")
        st = self._path.stat()
        self._stamp = (st.st_ino, st.st_mtime_ns, st.st_size)

    def refresh(self) -> bool:
        """Reload from the key file if another process (``vaultmail keys rotate``) changed
        it; True when something was reloaded. Cheap (one stat) when nothing changed."""
        if self._path is None:
            return False
        try:
            st = self._path.stat()
        except OSError:
            return False
        if (st.st_ino, st.st_mtime_ns, st.st_size) == self._stamp:
            return False
        fresh = Keyring._read(self._path, self._office)
        self._keys, self._active, self._stamp = fresh._keys, fresh._active, fresh._stamp
        self._served, self._revoked = fresh._served, fresh._revoked
        self._renamed, self._taken = fresh._renamed, fresh._taken
        return True

    # -- keys --------------------------------------------------------------------------------
    @property
    def path(self) -> Path | None:
        return self._path

    @property
    def office(self) -> str | None:
        """The office these keys sign for; None for the legacy keyring (or one made for no
        office)."""
        return self._office

    @property
    def served(self) -> tuple[str, ...] | None:
        """Of a keyring of no office (the legacy one): the offices it signed for, once
        recorded (``bind``); None until then."""
        self.refresh()
        return self._served

    def bind(self, offices: Iterable[str]) -> tuple[str, ...] | None:
        """Record, once, the offices a keyring of no office signed for (the legacy keyring:
        those installed when this version first met it); what another process recorded
        first stands. Returns the offices recorded."""
        chosen = _served(offices)
        if self._office is not None or not chosen:
            return self._served
        if self._path is None:
            if self._served is None:
                self._served = chosen
            return self._served
        with _locked(self._path):
            self.refresh()
            if self._served is None:
                self._served = chosen
                self._write()
        return self._served

    @property
    def active_kid(self) -> str:
        self.refresh()
        return self._active

    @property
    def key_ids(self) -> list[str]:
        """All key ids, oldest first."""
        return list(self._keys)

    def rotate(self, now: datetime | None = None) -> str:
        """Add a new key and make it active; old keys stay for verifying. Returns its id."""
        if self._path is not None:
            with _locked(self._path):
                self.refresh()
                return self._add(now)
        return self._add(now)

    def _add(self, now: datetime | None) -> str:
        key = SigningKey.generate(now, self._office)
        while key.kid in self._keys:  # pragma: no cover - 1 in 16M on the same day
            key = SigningKey.generate(now, self._office)
        self._keys[key.kid] = key
        self._active = key.kid
        self._write()
        return key.kid

    def revoke(self, kid: str, now: datetime | None = None) -> None:
        """Withdraw key ``kid`` (leaked): its private key is deleted, and it is published and
        trusted no more, here and in every process that reads the file. KeyringError when
        it is the active key (rotate first: something must sign), already revoked, or not
        one of these keys."""
        if self._path is None:
            self._revoke(kid, now)
            return
        with _locked(self._path):
            self.refresh()
            self._revoke(kid, now)

    def _revoke(self, kid: str, now: datetime | None) -> None:
        if kid in self._revoked:
            raise KeyringError(f"key {kid} was already revoked ({_iso(self._revoked[kid])})")
        if kid not in self._keys:
            raise KeyringError(f"no key {kid} here (keys: {', '.join(self._keys)})")
        if kid == self._active:
            raise KeyringError(f"{kid} is the active key, which signs: make a new one first")
        del self._keys[kid]
        self._revoked[kid] = (now or datetime.now(UTC)).astimezone(UTC)
        self._write()

    def revoked(self, kid: str) -> bool:
        self.refresh()
        return kid in self._revoked

    def sign(self, data: bytes, *, kid: str | None = None) -> tuple[str, str]:
        """Sign with the active key (or ``kid``); returns (key id, base64url signature)."""
        self.refresh()
        kid = kid or self._active
        key = self._keys.get(kid)
        if key is None:
            raise KeyringError(f"no signing key {kid!r}")
        return kid, b64url_encode(key.private.sign(data))

    def has_key(self, kid: str) -> bool:
        self.refresh()  # always: a key another process (replica, CLI) revoked is gone here too
        return kid in self._keys

    def verify(self, kid: str, data: bytes, signature: str) -> bool:
        if not self.has_key(kid):
            return False
        return _verify_with(self._keys[kid].public, data, signature)

    def speaks_for(self, kid: str) -> tuple[str, ...] | None:
        if not self.has_key(kid):
            return ()
        return (self._office,) if self._office is not None else self._served

    @property
    def renamed(self) -> dict[str, str]:
        """The names this office, and its vaults, had before ({was: now}, each as it is now):
        an org login (the office renamed with its org: ``Keyrings.rename``) or a vault's full
        name (``rename_vault``). Its headers signed under a name it had verify where that
        name went, and nowhere else: whoever takes the name later is another office."""
        self.refresh()
        return dict(self._renamed)

    @property
    def renamed_keys(self) -> dict[str, list[str]]:
        """The vaults' names before that another repository took since, each with the keys
        it still leads to the vault's new name for ({was: [kid, ...]}: the keys the office
        had then, ``renamed_for``)."""
        self.refresh()
        return {was: list(kids) for was, kids in self._taken.items()}

    def renamed_for(self, kid: str | None) -> dict[str, str]:
        """Its names before that lead to their new ones for what key ``kid`` signed (None:
        for what the office says now: its config, its refs). A vault's old name leads to
        where the vault went, as the forge's old URL does, until another repository takes
        it; from then on the name is that repository's, and only the keys the office had
        then (a new one signs from then on: ``Keyrings.vault_name_taken``) mean the vault
        by it."""
        self.refresh()
        return {was: now for was, now in self._renamed.items()
                if was not in self._taken or kid in self._taken[was]}

    def vault_now(self, kid: str, vault: str) -> str:
        if self._office is None or not self.has_key(kid):
            return vault
        return name_now(self.renamed_for(kid), vault)

    def _rename(self, renamed: dict[str, str], path: Path | None,
                taken: dict[str, list[str]] | None = None) -> None:
        """Take ``renamed`` as its names before (``taken``: those another repository took
        since, by default those it had: ``renamed_keys``), and ``path`` as its file; written
        there."""
        self._renamed = _renamed(renamed)
        self._taken = _taken(self._taken if taken is None else taken, self._renamed)
        self._path = path
        self._write()

    def public_jwks(self, *, legacy: bool = False) -> dict[str, Any]:
        """Its public keys as a JWK set (``legacy``: marked as keys that sign nothing now)."""
        self.refresh()
        return {
            "keys": [
                _public_jwk(k.kid, k.public, k.kid == self._active and not legacy, k.created,
                            office=self._office, served=self._served, legacy=legacy,
                            renamed=self.renamed_for(k.kid))
                for k in self._keys.values()
            ]
        }

    def public_keys(self) -> PublicKeys:
        return PublicKeys.from_jwks(self.public_jwks())


def _served(offices: Iterable[str] | None) -> tuple[str, ...] | None:
    if offices is None:
        return None
    if isinstance(offices, str):
        raise KeyringError("offices must be a list of organisation logins")
    return tuple(sorted({office_name(o) for o in offices})) or None


def _revoked_from_doc(doc: dict[str, Any], where: str) -> dict[str, datetime]:
    try:
        return {entry["kid"]: _parse_iso(entry["revoked"]) for entry in doc.get("revoked", [])}
    except (KeyError, TypeError, ValueError) as exc:
        raise KeyringError(f"{where}: revoked: {exc}") from exc


def _renamed(names: Any) -> dict[str, str]:
    """An office's names before ({was: now}): org logins, or vaults' full names."""
    if names is None:
        return {}
    if not isinstance(names, dict):
        raise KeyringError("renamed must be an object {was: now}")
    out: dict[str, str] = {}
    for was, now in names.items():
        if not isinstance(was, str) or not isinstance(now, str) or ("/" in was) != ("/" in now):
            raise KeyringError("renamed must map an org to an org, a vault to a vault")
        office_name(was.partition("/")[0])
        office_name(now.partition("/")[0])
        out[was.lower()] = now.lower()
    return out


def _taken(taken: Any, renamed: dict[str, str]) -> dict[str, list[str]]:
    """A key file's ``renamed_keys`` ({was: [kid, ...]}), for names among ``renamed``'s only
    (a name renamed anew, or given back, is not taken)."""
    if taken is None:
        return {}
    if not isinstance(taken, dict) or not all(
            isinstance(kids, list) and all(isinstance(k, str) for k in kids)
            for kids in taken.values()):
        raise KeyringError("renamed_keys must be an object {was: [key id, ...]}")
    return {str(was).lower(): list(kids) for was, kids in taken.items()
            if str(was).lower() in renamed}


def former_offices(renamed: dict[str, str]) -> list[str]:
    """The org logins among an office's names before (the rest are vaults)."""
    return [was for was in renamed if "/" not in was]


def name_now(renamed: dict[str, str], vault: str) -> str:
    """What ``vault`` is called now by an office's names before (see ``Keyring.renamed``):
    its own rename, else its owner's (then its own under the new owner's name)."""
    vault = vault.strip().lower()
    if vault in renamed:
        return renamed[vault]
    owner, _, repo = vault.partition("/")
    if owner in renamed and repo:
        moved = f"{renamed[owner]}/{repo}"
        return renamed.get(moved, moved)
    return vault


def names_before(renamed: dict[str, str], ref: str) -> list[str]:
    """The names ``ref`` (an org, ``owner/repo`` or ``owner/repo#N``, as it is called now)
    had by an office's names before: ``name_now``'s other way round, each leading to it."""
    base, hash_, number = ref.strip().lower().partition("#")
    owner, _, repo = base.partition("/")
    owners = {owner} | {was.partition("/")[0] for was in renamed}
    repos = {repo} | {was.partition("/")[2] for was in renamed if "/" in was}
    names = {f"{o}/{r}" if repo else o for o in owners for r in repos}
    return sorted(n + hash_ + number for n in names - {base} if name_now(renamed, n) == base)


def renamed_to(renamed: dict[str, str], was: str, now: str) -> dict[str, str]:
    """``renamed`` once ``was`` (an org login, or a vault's full name) is called ``now``:
    every name that went to ``was`` (or into it) goes to ``now``, and ``was`` itself too.
    A name given back is no name before."""
    was, now = was.lower(), now.lower()

    def moved(name: str) -> str:
        if name == was:
            return now
        if "/" not in was and name.startswith(was + "/"):
            return now + name[len(was):]
        return name

    out = {old: moved(new) for old, new in renamed.items()}
    out[was] = now
    return {old: new for old, new in out.items() if old != new}


def _keys_from_doc(doc: Any, where: str) -> tuple[list[SigningKey], str]:
    if not isinstance(doc, dict) or doc.get("version") != _FILE_VERSION:
        raise KeyringError(f"{where}: not a vaultmail key file (version {_FILE_VERSION})")
    entries = doc.get("keys")
    active = doc.get("active")
    if not isinstance(entries, list) or not entries or not isinstance(active, str):
        raise KeyringError(f"{where}: needs 'active' and a non-empty 'keys' list")
    keys: list[SigningKey] = []
    for i, entry in enumerate(entries):
        try:
            kid = entry["kid"]
            if not isinstance(kid, str) or not kid:
                raise ValueError("kid must be a non-empty string")
            raw = b64url_decode(entry["private"])
            if len(raw) != 32:
                raise ValueError("private key must be 32 bytes")
            keys.append(
                SigningKey(
                    kid, _parse_iso(entry["created"]), Ed25519PrivateKey.from_private_bytes(raw)
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise KeyringError(f"{where}: keys[{i}]: {exc}") from exc
    return keys, active


def _moved_aside(path: Path, aside: Path, kept_as: str) -> Path:
    """`path` moved into directory `aside` as `<kept_as><its suffix>`, numbered past any
    there (what the name got between a crash and its retry): where it went."""
    aside.mkdir(mode=0o700, exist_ok=True)
    kept, n = aside / f"{kept_as}{path.suffix}", 1
    while kept.exists():
        kept, n = aside / f"{kept_as}.{n}{path.suffix}", n + 1
    os.replace(path, kept)
    return kept


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    if fcntl is None:  # pragma: no cover
        yield
        return
    lock = path.with_name(f".{path.name}.lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


# -- public keys only --------------------------------------------------------------------------


@dataclass(frozen=True)
class PublicKey:
    kid: str
    public: Ed25519PublicKey
    active: bool
    created: datetime | None
    office: str | None = None  # the office whose key it is
    served: tuple[str, ...] | None = None  # a legacy key's offices, once recorded
    legacy: bool = False
    renamed: dict[str, str] | None = None  # its office's names before (Keyring.renamed)


class PublicKeys:
    """Published keys only: verifies, never signs. Build with ``from_jwks``. What is published
    names no revoked key; ``revoked``, where given, tells them (the key files beside the app,
    read by `vaultmail verify` on its machine), so a refusal can say why."""

    def __init__(self, keys: list[PublicKey],
                 revoked: Callable[[str], bool] | None = None) -> None:
        self._keys = {k.kid: k for k in keys}
        self._revoked = revoked

    @classmethod
    def from_jwks(cls, jwks: Any, *, revoked: Callable[[str], bool] | None = None
                  ) -> PublicKeys:
        """Read a JWK set as published by ``Keyrings.public_jwks``. Keys of other types are
        skipped; a malformed Ed25519 key is an error (KeyringError) naming which."""
        if not isinstance(jwks, dict) or not isinstance(jwks.get("keys"), list):
            raise KeyringError('key document must be a JSON object {"keys": [...]}')
        keys: list[PublicKey] = []
        for i, jwk in enumerate(jwks["keys"]):
            if not isinstance(jwk, dict):
                raise KeyringError(f"keys[{i}]: must be an object")
            if jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519":
                continue
            kid = jwk.get("kid")
            if not isinstance(kid, str) or not kid:
                raise KeyringError(f"keys[{i}]: kid must be a non-empty string")
            try:
                raw = b64url_decode(jwk.get("x", ""))
                if len(raw) != 32:
                    raise ValueError("x must be 32 bytes")
                public = Ed25519PublicKey.from_public_bytes(raw)
            except ValueError as exc:
                raise KeyringError(f"keys[{i}] ({kid}): bad public key: {exc}") from exc
            created: datetime | None = None
            if isinstance(jwk.get("created"), str):
                with contextlib.suppress(ValueError):
                    created = _parse_iso(jwk["created"])
            try:
                office = office_name(jwk["office"]) if "office" in jwk else None
                renamed = _renamed(jwk.get("renamed")) if office is not None else {}
                if office is not None and kid_office(kid) not in (
                        office, *former_offices(renamed)):
                    raise KeyringError(f"its id names neither office {office} nor a name "
                                       "it had")
                served = _served(jwk["offices"]) if "offices" in jwk else None
            except (KeyringError, TypeError) as exc:
                raise KeyringError(f"keys[{i}] ({kid}): {exc}") from exc
            keys.append(PublicKey(kid, public, jwk.get("active") is True, created, office,
                                  served, jwk.get("legacy") is True, renamed or None))
        return cls(keys, revoked)

    @property
    def key_ids(self) -> list[str]:
        return list(self._keys)

    @property
    def active_kid(self) -> str | None:
        return next((k.kid for k in self._keys.values() if k.active), None)

    def has_key(self, kid: str) -> bool:
        return kid in self._keys

    def verify(self, kid: str, data: bytes, signature: str) -> bool:
        key = self._keys.get(kid)
        return key is not None and _verify_with(key.public, data, signature)

    def revoked(self, kid: str) -> bool:
        # a revoked key is left out of what is published, not named there
        return kid not in self._keys and self._revoked is not None and self._revoked(kid)

    def speaks_for(self, kid: str) -> tuple[str, ...] | None:
        key = self._keys.get(kid)
        if key is None:
            return ()
        return (key.office,) if key.office is not None else key.served

    def vault_now(self, kid: str, vault: str) -> str:
        key = self._keys.get(kid)
        return name_now(key.renamed, vault) if key is not None and key.renamed else vault

    def to_jwks(self) -> dict[str, Any]:
        return {
            "keys": [
                _public_jwk(k.kid, k.public, k.active, k.created or datetime.fromtimestamp(0, UTC),
                            office=k.office, served=k.served, legacy=k.legacy,
                            renamed=k.renamed)
                for k in self._keys.values()
            ]
        }


# -- every office's keys -----------------------------------------------------------------------


class Keyrings:
    """Every office's keyring and the legacy one: signs for an office (``for_office``),
    verifies for all of them, and publishes each office's keys apart (``public_jwks``).

    ``Keyrings.in_data_dir(dir)`` keeps each office's keys in ``dir/signing-keys/<org>.json``,
    made at its first ``for_office`` (never by verifying or publishing), and reads the legacy
    ``dir/signing-keys.json`` when there is one (it is never made). ``installed`` says which
    offices the deployment serves now: the legacy keys are bound to them the first time it
    names any (see the module docstring). ``Keyrings.ephemeral()`` keeps everything in memory.
    """

    def __init__(self, directory: Path | None = None, *, legacy: Keyring | None = None,
                 legacy_path: Path | None = None, mail_dir: Path | None = None,
                 installed: Callable[[], Iterable[str]] | None = None) -> None:
        self._dir = directory
        self._mail_dir = mail_dir
        self._legacy = legacy
        self._legacy_path = legacy_path
        self._rings: dict[str, Keyring] = {}
        # {a name an office had: the offices that had it}, read from the key files as the
        # directory stood (`_stamp`): what finds a key signed under a name since given up
        self._former: dict[str, list[str]] = {}
        self._former_stamp: int | None = -1
        self.installed: Callable[[], Iterable[str]] = installed or (lambda: ())

    @classmethod
    def in_data_dir(cls, data_dir: str | Path, *,
                    installed: Callable[[], Iterable[str]] | None = None) -> Keyrings:
        data_dir = Path(data_dir)
        return cls(data_dir / OFFICE_KEYS_DIR, legacy_path=data_dir / KEYS_FILE_NAME,
                   mail_dir=data_dir / MAIL_KEYS_DIR, installed=installed)

    @classmethod
    def ephemeral(cls, *, legacy: Keyring | None = None,
                  installed: Callable[[], Iterable[str]] | None = None) -> Keyrings:
        return cls(None, legacy=legacy, installed=installed)

    # -- signing ---------------------------------------------------------------------------
    def for_office(self, org: str) -> Keyring:
        """The keyring ``org``'s office signs with, made (one fresh key) at its first use."""
        office = office_name(org)
        ring = self._cached(office)
        if ring is not None:
            return ring
        if self._dir is None:
            ring = Keyring.ephemeral(office=office)
        else:
            self._dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            ring = Keyring.load_or_create(self._dir / f"{office}.json", office=office)
        return self._rings.setdefault(office, ring)

    async def prepare(self, org: str) -> None:
        """Have ``org``'s keyring at hand before it signs: read, or made (a new key written and
        synced to disk, some milliseconds) in a thread, so that the office's first mail stalls
        no other work of the event loop. What ``for_office`` then returns; KeyringError as
        there."""
        office = office_name(org)
        if self._cached(office) is not None or self._dir is None:
            return
        directory = self._dir

        def load() -> Keyring:  # (under the key file's lock, as any process loads it)
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            return Keyring.load_or_create(directory / f"{office}.json", office=office)

        ring = await asyncio.to_thread(load)
        self._rings.setdefault(office, ring)  # (one loaded meanwhile reads the same file)

    async def ready_for(self, org: str) -> Keyring:
        """``org``'s keyring, read or made in a thread first (``prepare``): what code on the
        event loop signs with, so that an office's first mail syncs no file on the loop."""
        await self.prepare(org)
        return self.for_office(org)

    def signer_for(self, org: str | None) -> Keyring:
        """What signs a record of office ``org`` (a ledger entry sent to a webhook): that
        office's keyring. A record of no office was written before offices had keys (the
        deployment's word then): the legacy keyring signs it, as it did; KeyringError when
        there is none."""
        if org is not None:
            return self.for_office(org)
        if self.legacy is None:
            raise KeyringError("a record of no office, and no legacy keyring to sign it")
        return self.legacy

    def existing(self, org: str) -> Keyring | None:
        """``org``'s keyring when it has one (made here or by another process), else None:
        nothing is made."""
        try:
            office = office_name(org)
        except KeyringError:
            return None
        ring = self._cached(office)
        if ring is None and self._dir is not None:
            path = self._dir / f"{office}.json"
            if path.exists():
                ring = self._rings.setdefault(office, Keyring.load_or_create(path,
                                                                             office=office))
        return ring

    def _cached(self, office: str) -> Keyring | None:
        """The keyring read before, unless its file has gone since (another process renamed
        the office: `rename`): a name given up signs with none of its keys any more."""
        ring = self._rings.get(office)
        if ring is not None and ring.path is not None and not ring.path.exists():
            del self._rings[office]
            return None
        return ring

    # -- renames ---------------------------------------------------------------------------
    def rename(self, old: str, new: str) -> None:
        """Office ``old``'s keys become office ``new``'s, its org renamed (the same account):
        moved into ``new``'s key file, ``old`` recorded among the names it had
        (``Keyring.renamed``), and a key naming ``new`` made the active one. What it signed
        as ``old`` verifies in its vaults under their new names; the name ``old`` keeps none
        of its keys, so whoever takes it later signs with keys of its own and verifies
        nothing the office signed. An office that never signed gets its key file here, so
        that its names before are kept all the same (its config may say them). Idempotent (a
        retry after a crash). Keys under ``new`` that do not record ``old`` are another
        office's (one whose org left the name): the callers set them aside first
        (``retire``), and any still there are set aside here, never merged. Its email
        secrets move with them (``_follow_mail_keys``)."""
        old, new = office_name(old), office_name(new)
        with contextlib.ExitStack() as stack:
            if self._dir is not None:
                self._dir.mkdir(mode=0o700, parents=True, exist_ok=True)
                for path in sorted((self._dir / f"{old}.json", self._dir / f"{new}.json")):
                    stack.enter_context(_locked(path))
            src, dst = self._unlocked(old), self._unlocked(new)
            if dst is not None and old not in dst.renamed:
                log.warning("keys under a name another office left: set aside, not merged",
                            extra={"org": new, "was": old})
                self._set_aside(new, f"{new}~0")
                dst = None
            self._follow_mail_keys(old, new)  # (before any return: a retry moves what is left)
            if src is None and dst is not None:  # moved already: a retry after a crash
                self._rings[new] = dst
                self._former_stamp = -1
                return
            names = renamed_to({**(dst.renamed if dst else {}),
                                **(src.renamed if src else {})}, old, new)
            taken = {**(dst.renamed_keys if dst else {}), **(src.renamed_keys if src else {})}
            keys = {k.kid: k for ring in (dst, src) if ring is not None
                    for k in ring._keys.values()}
            if (base := dst or src) is not None:
                ring = Keyring(list(keys.values()), base._active, office=new, renamed=names)
            else:  # it never signed: a key of its own now, to keep its names in
                key = SigningKey.generate(None, new)
                ring = Keyring([key], key.kid, office=new, renamed=names)
            ring._rename(names, None if self._dir is None else self._dir / f"{new}.json", taken)
            if kid_office(ring._active) != new:
                ring._add(None)
            if src is not None and src.path is not None:
                src.path.unlink()
            self._rings.pop(old, None)
            self._rings[new] = ring
            self._former_stamp = -1

    def retire(self, org: str, kept_as: str) -> Path | None:
        """Office ``org``'s keys set aside, its name now another account's (the old office is
        kept as ``kept_as``, ``bot.store.offices.retire_in``): the key file moves to
        ``retired/<kept_as>.json``, the operator's, where no office reads it. The new owner's
        office then signs with a key of its own made at its first use, and neither publishes
        nor trusts one the old office signed with: what the old office signed, copied into a
        vault of the same name, is not the new owner's word. Its email secrets go the same
        way (``dkim/retired/<kept_as>.pem`` and ``.ids``): the new owner's office makes a DKIM
        key and a Message-ID key of its own, so no reply to the old office's mail threads
        into it. Returns where the keys went (None when the name had none: a retry after a
        crash finds them moved already)."""
        office = office_name(org)
        self._rings.pop(office, None)
        if self._dir is None:
            return None
        self._dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        with _locked(self._dir / f"{office}.json"):
            return self._set_aside(office, kept_as)

    def _set_aside(self, office: str, kept_as: str) -> Path | None:
        """``retire``'s move, its file's lock held by the caller."""
        self._rings.pop(office, None)
        self._former_stamp = -1
        if self._dir is None:
            return None
        for suffix in MAIL_KEY_SUFFIXES:  # (an office may have mailed, never signed)
            self._mail_key_aside(f"{office}{suffix}", kept_as)
        path = self._dir / f"{office}.json"
        if not path.exists():
            return None
        return _moved_aside(path, self._dir / "retired", kept_as)

    def _mail_key_aside(self, name: str, kept_as: str) -> None:
        """Email secret file `name` (bot.email.keys) to ``dkim/retired/``, under its lock."""
        if self._mail_dir is None or not self._mail_dir.exists():
            return
        with _locked(self._mail_dir / name):
            if (self._mail_dir / name).exists():
                _moved_aside(self._mail_dir / name, self._mail_dir / "retired", kept_as)

    def _follow_mail_keys(self, old: str, new: str) -> None:
        """Office ``old``'s email secrets become ``new``'s, each moved under both names'
        locks (those bot.email.keys makes them under). The published DKIM record
        (``vaultmail._domainkey.<its domain>``) names no org, so it still holds; and replies
        to mail sent before still thread. One under ``new`` already was made there since
        (by nothing of this office's, whose mail went under ``old`` until now): set aside,
        never used in place of the office's own. Nothing under ``old`` (it never mailed, or
        a retry finds them moved): nothing moves."""
        if self._mail_dir is None or not self._mail_dir.exists() or old == new:
            return
        for suffix in MAIL_KEY_SUFFIXES:
            src, dst = self._mail_dir / f"{old}{suffix}", self._mail_dir / f"{new}{suffix}"
            with _locked(min(src, dst)), _locked(max(src, dst)):
                if not src.exists():
                    continue
                if dst.exists():
                    log.warning("an email secret under a name the office takes: set aside",
                                extra={"org": new, "was": old, "file": suffix})
                    _moved_aside(dst, self._mail_dir / "retired", f"{new}~0")
                os.replace(src, dst)

    def renamed(self, org: str) -> dict[str, str]:
        """The names ``org``'s office had that lead to its, or its vaults', names now ({was:
        now}: ``Keyring.renamed``, less a vault's old name another repository took since:
        ``Keyring.renamed_for``): what its config and its refs may still say; none made."""
        ring = self.existing(org)
        return ring.renamed_for(None) if ring is not None else {}

    def _unlocked(self, office: str) -> Keyring | None:
        """``office``'s keyring read afresh (the caller holds its file's lock), or None."""
        if self._dir is None:
            return self._rings.get(office)
        path = self._dir / f"{office}.json"
        return Keyring._read(path, office) if path.exists() else None

    def rename_vault(self, old: str, new: str) -> None:
        """A vault of an office renamed (``owner/repo`` to ``owner/other``): what the office
        signed for it under its old name verifies under the new (``Keyring.renamed``). A
        vault is renamed within its office: one that went to another owner (transferred) is
        not followed, nor a keyring made for that owner."""
        if vault_office(old) != vault_office(new):
            raise ValueError(f"{old} went to another owner ({new}): not a rename")
        ring = self.for_office(vault_office(new))
        with contextlib.ExitStack() as stack:
            if ring.path is not None:
                stack.enter_context(_locked(ring.path))
            ring.refresh()
            # (a name taken, and now renamed itself: it leads to where that repository went)
            ring._rename(renamed_to(ring._renamed, old, new), ring.path,
                         {was: kids for was, kids in ring._taken.items() if was != old.lower()})

    def vault_name_taken(self, vault: str) -> bool:
        """Another repository took ``vault`` (``owner/repo``), a name a vault of its owner's
        office had before a rename: from now on the name is that repository's, for the
        office's config and refs (``renamed``) and for what it signs, with a new key made
        here; what the keys it had signed under the name still verifies where the vault went
        (``Keyring.renamed_for``). False when the name led nowhere (no vault of the office had
        it, or it was taken already): nothing changed."""
        vault = vault.strip().lower()
        ring = self.existing(vault_office(vault))
        if ring is None or vault not in ring.renamed or vault in ring.renamed_keys:
            return False
        with contextlib.ExitStack() as stack:
            if ring.path is not None:
                stack.enter_context(_locked(ring.path))
            ring.refresh()
            ring._rename(ring._renamed, ring.path, {**ring._taken, vault: sorted(ring._keys)})
            ring._add(None)  # (what it signs from now on, under that name, is the new one's)
        return True

    def _had(self, name: str) -> list[Keyring]:
        """The keyrings of the offices that were once called ``name``."""
        stamp = self._dir.stat().st_mtime_ns if self._dir is not None and self._dir.is_dir() \
            else None
        if stamp != self._former_stamp or stamp is None:
            former: dict[str, list[str]] = {}
            for office in self.offices():
                ring = self.existing(office)
                for was in former_offices(ring.renamed if ring is not None else {}):
                    former.setdefault(was, []).append(office)
            self._former, self._former_stamp = former, stamp
        found = (self.existing(o) for o in self._former.get(name, []))
        return [ring for ring in found if ring is not None]

    def offices(self) -> list[str]:
        """The offices that have keys, here or in the data directory."""
        found = set(self._rings)
        if self._dir is not None and self._dir.is_dir():
            found |= {p.name.removesuffix(".json") for p in self._dir.glob("*.json")
                      if _OFFICE_RE.fullmatch(p.name.removesuffix(".json"))}
        return sorted(found)

    @property
    def legacy(self) -> Keyring | None:
        """The legacy keyring, if this deployment had one (read when first needed)."""
        if self._legacy is None and self._legacy_path is not None \
                and self._legacy_path.exists():
            self._legacy = Keyring._read(self._legacy_path)
        return self._legacy

    def legacy_offices(self) -> tuple[str, ...] | None:
        """The offices the legacy keys speak for: recorded once, the first time any office is
        installed when they are asked about; None (any office) until then."""
        legacy = self.legacy
        if legacy is None:
            return ()
        served = legacy.served
        if served is None:
            served = legacy.bind(o for o in self.installed() if _is_office(o))
        return served

    # -- verifying -------------------------------------------------------------------------
    def _ring_of(self, kid: str) -> Keyring | None:
        office = kid_office(kid)
        if office is None:
            return self.legacy
        ring = self.existing(office)
        if ring is not None and ring.has_key(kid):
            return ring
        # a key of a name its office has given up (renamed): that office's, not the name's
        return next((r for r in self._had(office) if r.has_key(kid)), ring)

    def has_key(self, kid: str) -> bool:
        ring = self._ring_of(kid)
        return ring is not None and ring.has_key(kid)

    def verify(self, kid: str, data: bytes, signature: str) -> bool:
        ring = self._ring_of(kid)
        return ring is not None and ring.verify(kid, data, signature)

    def revoked(self, kid: str) -> bool:
        ring = self._ring_of(kid)
        return ring is not None and ring.revoked(kid)

    def speaks_for(self, kid: str) -> tuple[str, ...] | None:
        ring = self._ring_of(kid)
        if ring is None or not ring.has_key(kid):
            return ()
        if ring.office is None:
            return self.legacy_offices()
        return ring.speaks_for(kid)

    def vault_now(self, kid: str, vault: str) -> str:
        ring = self._ring_of(kid)
        return ring.vault_now(kid, vault) if ring is not None else vault

    # -- publishing ------------------------------------------------------------------------
    def public_jwks(self, org: str | None = None) -> dict[str, Any]:
        """With ``org``: that office's keys (made if it has none yet) and the legacy keys that
        served it, for ``GET /.well-known/vaultmail-keys/<org>.json``. Without: every office's
        and every legacy key, for ``GET /.well-known/vaultmail-keys.json``."""
        if org is not None:
            office = office_name(org)
            keys = self.for_office(office).public_jwks()["keys"]
            served = self.legacy_offices()
            if self.legacy is not None and served is not None and office in served:
                keys += self.legacy.public_jwks(legacy=True)["keys"]
            return {"keys": keys}
        keys = []
        for office in self.offices():
            ring = self.existing(office)
            if ring is not None:
                keys += ring.public_jwks()["keys"]
        if self.legacy is not None:
            self.legacy_offices()  # bound now, when it can be, so the document says so
            keys += self.legacy.public_jwks(legacy=True)["keys"]
        return {"keys": keys}

    def public_keys(self, org: str | None = None) -> PublicKeys:
        return PublicKeys.from_jwks(self.public_jwks(org))


__all__ = [
    "KEYS_FILE_NAME",
    "OFFICE_KEYS_DIR",
    "Keyring",
    "KeyringError",
    "Keyrings",
    "PublicKey",
    "PublicKeys",
    "SigningKey",
    "Signer",
    "Verifier",
    "b64url_decode",
    "b64url_encode",
    "kid_office",
    "name_now",
    "new_key_id",
    "office_name",
    "vault_office",
]
