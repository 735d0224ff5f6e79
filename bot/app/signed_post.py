"""Signed outbound POSTs (run dispatch, ledger triggers): JSON signed with the office's key.

The signature is bound to where the POST goes, when, and as which delivery, not only to its
body: signed over the body alone, one receiver of an office could replay what it got to any
other receiver of that office's keys (a runner's payload to the office's trigger URL), and
again later, and relabel its event or delivery number. Headers::

    X-Vaultmail-Timestamp: <unix seconds>
    X-Vaultmail-Event: <event>            (a ledger entry's event; `run` for a run)
    X-Vaultmail-Delivery: <id>            (a ledger entry's number; `run-<n>` for a run)
    X-Vaultmail-Signature: v2=<kid>.<signature>

the signature Ed25519 over ``signed_text``: ``vaultmail-v2``, the timestamp, the URL exactly as
sent to (as the office's config names it), the event and the delivery (empty when absent), and
the raw body, joined by newlines. ``check_signed_post`` is the receiver's check (sans-I/O;
docs/using.md, *Checking a signature*, is the same in a few lines). The body-only form of
before is not sent: a receiver still checking it would still take replays.

Each POST goes only where the operator's outbound policy lets it for the office it is sent for
(`bot.app.egress`): a URL from an org's config is someone else's input.
"""

from __future__ import annotations

import json
import time
from collections.abc import Container, Mapping
from typing import Any

from bot.app.egress import OutboundPolicy
from bot.mail.signing import Signer, Verifier
from bot.names import Behalf

VERSION = "v2"
TOLERANCE_SECONDS = 300  # a receiver takes a timestamp this far from its clock, either way


class SignatureRefused(ValueError):
    """A signed POST a receiver must not act on; the message says why."""


def signed_text(timestamp: str, url: str, event: str, delivery: str, body: bytes) -> bytes:
    """What is signed. Headers and URLs hold no newline, so each part ends where it seems to."""
    head = "\n".join([f"vaultmail-{VERSION}", timestamp, url, event, delivery, ""])
    return head.encode() + body


async def post_signed(keyring: Signer, url: str, payload: Mapping[str, Any], *,
                      outbound: OutboundPolicy, office: Behalf, event: str = "",
                      delivery: str = "", timeout: float = 10.0) -> None:
    """POST `payload` to `url` on `office`'s behalf, signed for that URL, now, `event` and
    `delivery`; raises OutboundRefused (nothing sent) when `outbound` does not let `office`'s
    request reach `url`'s address, else on a network error or a status that is not 2xx. Each
    try is signed anew."""
    body = json.dumps(payload, sort_keys=True).encode()
    timestamp = str(int(time.time()))
    kid, sig = keyring.sign(signed_text(timestamp, url, event, delivery, body))
    headers = {"Content-Type": "application/json", "User-Agent": "vaultmail",
               "X-Vaultmail-Timestamp": timestamp,
               "X-Vaultmail-Signature": f"{VERSION}={kid}.{sig}"}
    if event:
        headers["X-Vaultmail-Event"] = event
    if delivery:
        headers["X-Vaultmail-Delivery"] = delivery
    # a redirect would lead the request past the address checked: it is answered as a failure
    async with outbound.session(url, office=office, timeout=timeout) as session, \
            session.post(url, data=body, headers=headers, allow_redirects=False) as resp:
        if resp.status >= 300:
            moved = " (redirects are not followed: give the final URL)" \
                if 300 <= resp.status < 400 else ""
            raise RuntimeError(f"POST {url} answered {resp.status}{moved}")


def check_signed_post(keys: Verifier, office: str, url: str, headers: Mapping[str, str],
                      body: bytes, *, now: float, seen: Container[str] = frozenset()) -> str:
    """A receiver's check of a signed POST it got at `url` (its own, as its office's config
    names it), with office `office`'s published keys, at time `now`: the key is the office's,
    the signature holds over this URL, the timestamp, the event, the delivery and the raw
    body, the timestamp is within 5 minutes, and the delivery is not among those `seen`.
    Returns the delivery (to add to `seen` once handled); SignatureRefused says why not."""
    def header(name: str) -> str:
        return next((v for k, v in headers.items() if k.lower() == name.lower()), "")

    version, _, signed = header("X-Vaultmail-Signature").partition("=")
    kid, _, sig = signed.partition(".")
    if version != VERSION or not sig:
        raise SignatureRefused(f"X-Vaultmail-Signature is not {VERSION}=<kid>.<signature>")
    offices = keys.speaks_for(kid)
    if offices == () or (offices is not None and office not in offices):
        raise SignatureRefused(f"{kid} is not a key of office {office}")
    timestamp, event, delivery = (header("X-Vaultmail-Timestamp"), header("X-Vaultmail-Event"),
                                  header("X-Vaultmail-Delivery"))
    if not keys.verify(kid, signed_text(timestamp, url, event, delivery, body), sig):
        raise SignatureRefused(f"the signature does not verify for {url}: forged, altered, or "
                               "sent to another URL")
    if not timestamp.isdigit() or abs(now - int(timestamp)) > TOLERANCE_SECONDS:
        raise SignatureRefused(f"timestamp {timestamp!r} is not within "
                               f"{TOLERANCE_SECONDS // 60} minutes of now: a replay")
    if delivery in seen:
        raise SignatureRefused(f"delivery {delivery} was seen: a replay, or a retry of one "
                               "handled (answer it 2xx)")
    return delivery
