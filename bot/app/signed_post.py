"""Signed outbound POSTs (run dispatch, ledger triggers): JSON signed with the office's key.

Receivers verify `X-Vaultmail-Signature: <kid>.<signature>` (Ed25519 over the raw body) with
the keys published at /.well-known/vaultmail-keys.json.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import aiohttp

from bot.mail.signing import Signer


async def post_signed(keyring: Signer, url: str, payload: Mapping[str, Any], *,
                      headers: Mapping[str, str] | None = None, timeout: float = 10.0) -> None:
    """POST `payload`; raises on a network error or a status that is not 2xx."""
    body = json.dumps(payload, sort_keys=True).encode()
    kid, sig = keyring.sign(body)
    all_headers = {"Content-Type": "application/json", "User-Agent": "vaultmail",
                   "X-Vaultmail-Signature": f"{kid}.{sig}", **(headers or {})}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session, \
            session.post(url, data=body, headers=all_headers) as resp:
        if resp.status >= 300:
            raise RuntimeError(f"POST {url} answered {resp.status}")
