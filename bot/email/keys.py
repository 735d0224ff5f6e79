"""Each office's DKIM key (RSA 2048), made when it first signs: `dkim/<org>.pem` in the data
directory, mode 0600, and the DNS TXT record that publishes it; and the key of its
Message-IDs' digest. Both follow the office: moved when its org is renamed, set aside when
another account takes its name (`Keyrings.rename`, `retire`)."""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import hmac
import os
import secrets
from collections.abc import Callable
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from bot.mail.signing import MAIL_KEYS_DIR, office_name
from bot.private_files import private_dir, write_private

# the selector of every office's DKIM key in DNS (here, not in bot.email.outgoing, which signs
# with it: the items load this module for the key that seals comments, and need no DKIM)
SELECTOR = "vaultmail"


def key_path(data_dir: Path, org: str) -> Path:
    return data_dir / MAIL_KEYS_DIR / f"{office_name(org)}.pem"


def office_key(data_dir: Path, org: str) -> bytes:
    """The office's private key (PEM), made under a file lock the first time."""
    def make() -> str:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption()).decode()

    return _made_once(key_path(data_dir, org), make)


def message_id_secret(data_dir: Path, org: str) -> bytes:
    """The key of the digest in the office's own Message-IDs (bot.email.outgoing), made the
    first time: `dkim/<org>.ids` beside the DKIM key (back both up). A file of its own, so a
    DKIM key replaced changes no Message-ID (a retry sends under the id it had)."""
    path = key_path(data_dir, org).with_suffix(".ids")
    return _made_once(path, lambda: secrets.token_hex(32)).strip()


def comment_key(data_dir: Path, org: str) -> bytes:
    """The key that seals the office's comments and question cards on the forge
    (`bot.items.render.seal`): derived from the Message-ID key, so it needs no file, backup
    or move of its own."""
    return hmac.new(message_id_secret(data_dir, org), b"vaultmail comments",
                    hashlib.sha256).digest()


def _made_once(path: Path, make: Callable[[], str]) -> bytes:
    """`path`'s bytes, written (mode 0600) from `make` under a file lock the first time."""
    if path.exists():
        return path.read_bytes()
    private_dir(path.parent)
    with open(path.with_name(f".{path.name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not path.exists():
                write_private(path, make())
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(lock, fcntl.LOCK_UN)
    os.chmod(path, 0o600)
    return path.read_bytes()


def dns_record(private_pem: bytes, domain: str, selector: str = SELECTOR) -> tuple[str, str]:
    """(name, TXT value) publishing the key: `vaultmail._domainkey.<domain>`, `v=DKIM1; ...`."""
    key = serialization.load_pem_private_key(private_pem, password=None)
    public = key.public_key().public_bytes(serialization.Encoding.DER,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    return (f"{selector}._domainkey.{domain}",
            f"v=DKIM1; k=rsa; p={base64.b64encode(public).decode()}")
