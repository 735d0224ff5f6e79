"""Ed25519 signing keys for mail headers (DESIGN §3.4).

``Keyring`` holds the office's private keys, persisted as JSON (mode 0600) in the data
directory; one key is active and signs, older ones stay for verifying after ``rotate()``.
``PublicKeys`` holds only the published keys (``GET /.well-known/vaultmail-keys.json``) and
verifies; ``vaultmail verify`` uses it with nothing else.

Key ids look like ``vm-20250131-3fa9c2`` (creation date and six random hex digits).
Signatures are raw 64-byte Ed25519 signatures in base64url without padding.

The published document (a JWK set, RFC 8037 OKP keys)::

    {"keys": [{"kid": "vm-...", "kty": "OKP", "crv": "Ed25519", "x": "<b64url>",
               "use": "sig", "alg": "EdDSA", "active": true, "created": "2025-01-31T09:00:00Z"}]}

The private file::

    {"version": 1, "active": "vm-...",
     "keys": [{"kid": "vm-...", "created": "...Z", "private": "<b64url raw 32 bytes>"}]}
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import secrets
from collections.abc import Iterator
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

from bot.private_files import write_private

try:  # POSIX: serialise creation and rotation between processes (app and CLI)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

KEYS_FILE_NAME = "signing-keys.json"
_FILE_VERSION = 1


class KeyringError(ValueError):
    """A key file or key document that cannot be used; the message says which and why."""


class Verifier(Protocol):
    """Anything that can check a signature by key id: a Keyring or PublicKeys."""

    def has_key(self, kid: str) -> bool: ...

    def verify(self, kid: str, data: bytes, signature: str) -> bool: ...


class Signer(Protocol):
    @property
    def active_kid(self) -> str: ...

    def sign(self, data: bytes, *, kid: str | None = None) -> tuple[str, str]: ...


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


def new_key_id(now: datetime | None = None) -> str:
    now = now or datetime.now(UTC)
    return f"vm-{now.astimezone(UTC):%Y%m%d}-{secrets.token_hex(3)}"


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
    kid: str, public: Ed25519PublicKey, active: bool, created: datetime
) -> dict[str, Any]:
    return {
        "kid": kid,
        "kty": "OKP",
        "crv": "Ed25519",
        "x": b64url_encode(public.public_bytes(Encoding.Raw, PublicFormat.Raw)),
        "use": "sig",
        "alg": "EdDSA",
        "active": active,
        "created": _iso(created),
    }


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
    def generate(cls, now: datetime | None = None) -> SigningKey:
        now = (now or datetime.now(UTC)).astimezone(UTC).replace(microsecond=0)
        return cls(new_key_id(now), now, Ed25519PrivateKey.generate())


class Keyring:
    """The office's signing keys. Create with ``load_or_create(path)`` (persisted) or
    ``ephemeral()`` (in memory, for tests and the demo)."""

    def __init__(self, keys: list[SigningKey], active: str, path: Path | None = None) -> None:
        if not keys:
            raise KeyringError("a keyring needs at least one key")
        by_kid = {k.kid: k for k in keys}
        if len(by_kid) != len(keys):
            raise KeyringError("duplicate key ids in keyring")
        if active not in by_kid:
            raise KeyringError(f"active key {active!r} is not in the keyring")
        self._keys = by_kid
        self._active = active
        self._path = path
        self._stamp: tuple[int, int, int] | None = None

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def ephemeral(cls, now: datetime | None = None) -> Keyring:
        key = SigningKey.generate(now)
        return cls([key], key.kid)

    @classmethod
    def in_data_dir(cls, data_dir: str | Path) -> Keyring:
        return cls.load_or_create(Path(data_dir) / KEYS_FILE_NAME)

    @classmethod
    def load_or_create(cls, path: str | Path, now: datetime | None = None) -> Keyring:
        """Load the key file at ``path``, creating it with one fresh key when it is absent.
        A file that exists but cannot be read is an error, never overwritten."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(path):
            if not path.exists():
                key = SigningKey.generate(now)
                ring = cls([key], key.kid, path)
                ring._write()
                return ring
            ring = cls._read(path)
        return ring

    @classmethod
    def _read(cls, path: Path) -> Keyring:
        try:
            st = path.stat()
            if st.st_mode & 0o077:
                os.chmod(path, 0o600)
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise KeyringError(f"{path}: cannot read signing keys: {exc}") from exc
        keys, active = _keys_from_doc(doc, str(path))
        ring = cls(keys, active, path)
        ring._stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        return ring

    # -- persistence -------------------------------------------------------------------------
    def _doc(self) -> dict[str, Any]:
        return {
            "version": _FILE_VERSION,
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
        }

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
        fresh = Keyring._read(self._path)
        self._keys, self._active, self._stamp = fresh._keys, fresh._active, fresh._stamp
        return True

    # -- keys --------------------------------------------------------------------------------
    @property
    def path(self) -> Path | None:
        return self._path

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
        key = SigningKey.generate(now)
        while key.kid in self._keys:  # pragma: no cover - 1 in 16M on the same day
            key = SigningKey.generate(now)
        self._keys[key.kid] = key
        self._active = key.kid
        self._write()
        return key.kid

    def sign(self, data: bytes, *, kid: str | None = None) -> tuple[str, str]:
        """Sign with the active key (or ``kid``); returns (key id, base64url signature)."""
        self.refresh()
        kid = kid or self._active
        key = self._keys.get(kid)
        if key is None:
            raise KeyringError(f"no signing key {kid!r}")
        return kid, b64url_encode(key.private.sign(data))

    def has_key(self, kid: str) -> bool:
        if kid not in self._keys:
            self.refresh()
        return kid in self._keys

    def verify(self, kid: str, data: bytes, signature: str) -> bool:
        if not self.has_key(kid):
            return False
        return _verify_with(self._keys[kid].public, data, signature)

    def public_jwks(self) -> dict[str, Any]:
        """The document served at ``GET /.well-known/vaultmail-keys.json``."""
        self.refresh()
        return {
            "keys": [
                _public_jwk(k.kid, k.public, k.kid == self._active, k.created)
                for k in self._keys.values()
            ]
        }

    def public_keys(self) -> PublicKeys:
        return PublicKeys.from_jwks(self.public_jwks())


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


class PublicKeys:
    """Published keys only: verifies, never signs. Build with ``from_jwks``."""

    def __init__(self, keys: list[PublicKey]) -> None:
        self._keys = {k.kid: k for k in keys}

    @classmethod
    def from_jwks(cls, jwks: Any) -> PublicKeys:
        """Read a JWK set as published by ``Keyring.public_jwks``. Keys of other types are
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
            keys.append(PublicKey(kid, public, jwk.get("active") is True, created))
        return cls(keys)

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

    def to_jwks(self) -> dict[str, Any]:
        return {
            "keys": [
                _public_jwk(k.kid, k.public, k.active, k.created or datetime.fromtimestamp(0, UTC))
                for k in self._keys.values()
            ]
        }


__all__ = [
    "KEYS_FILE_NAME",
    "Keyring",
    "KeyringError",
    "PublicKey",
    "PublicKeys",
    "SigningKey",
    "Signer",
    "Verifier",
    "b64url_decode",
    "b64url_encode",
    "new_key_id",
]
