"""Signed outbound POSTs (run dispatch, ledger triggers): JSON signed with the office's key.

Receivers verify `X-Vaultmail-Signature: <kid>.<signature>` (Ed25519 over the raw body) with
their office's keys, published at /.well-known/vaultmail-keys/<org>.json. Each goes only where
the operator's outbound policy lets it (`bot.app.egress`): a URL from an org's config is
someone else's input.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from bot.app.egress import OutboundPolicy
from bot.mail.signing import Signer


async def post_signed(keyring: Signer, url: str, payload: Mapping[str, Any], *,
                      outbound: OutboundPolicy, headers: Mapping[str, str] | None = None,
                      timeout: float = 10.0) -> None:
    """POST `payload`; raises OutboundRefused (nothing sent) when `outbound` does not let the
    request reach `url`'s address, else on a network error or a status that is not 2xx."""
    body = json.dumps(payload, sort_keys=True).encode()
    kid, sig = keyring.sign(body)
    all_headers = {"Content-Type": "application/json", "User-Agent": "vaultmail",
                   "X-Vaultmail-Signature": f"{kid}.{sig}", **(headers or {})}
    # a redirect would lead the request past the address checked: it is answered as a failure
    async with outbound.session(url, timeout=timeout) as session, \
            session.post(url, data=body, headers=all_headers, allow_redirects=False) as resp:
        if resp.status >= 300:
            moved = " (redirects are not followed: give the final URL)" \
                if 300 <= resp.status < 400 else ""
            raise RuntimeError(f"POST {url} answered {resp.status}{moved}")
