"""Each office's DKIM key (RSA 2048), made when it first signs: `dkim/<org>.pem` in the data
directory, mode 0600, and the DNS TXT record that publishes it."""

from __future__ import annotations

import base64
import contextlib
import fcntl
import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from bot.email.outgoing import SELECTOR
from bot.mail.signing import office_name
from bot.private_files import private_dir, write_private


def key_path(data_dir: Path, org: str) -> Path:
    return data_dir / "dkim" / f"{office_name(org)}.pem"


def office_key(data_dir: Path, org: str) -> bytes:
    """The office's private key (PEM), made under a file lock the first time."""
    path = key_path(data_dir, org)
    if path.exists():
        return path.read_bytes()
    private_dir(path.parent)
    with open(path.with_name(f".{path.name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not path.exists():
                key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
                write_private(path, key.private_bytes(
                    serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption()).decode())
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
