"""Webhook intake: verify, dedupe by delivery id, persist, answer at once.

Nothing is stored for a delivery whose signature does not verify. The worker does the rest.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from gidgethub import sansio

from bot import metrics
from bot.app.bodies import (
    WEBHOOK_BODY_LIMIT,
    lone_surrogate_at,
    may_hold_surrogates,
    read_body,
    replace_surrogates,
)
from bot.app.services import SERVICES_KEY
from bot.errors import PayloadTooLarge
from bot.forge import gitea_events as gitea
from bot.store.queue import installation_of

log = logging.getLogger("vaultmail.intake")


def signature_valid(body: bytes, header: str | None, secret: str) -> bool:
    """Check `X-Hub-Signature-256` (sha256=<hex HMAC of the raw body>) in constant time."""
    if not header or not header.startswith("sha256="):
        return False
    expected = "sha256=" + hmac.digest(secret.encode(), body, hashlib.sha256).hex()
    return hmac.compare_digest(expected, header)


@dataclass(frozen=True)
class Dialect:
    """How one forge's deliveries are read: their headers, signature and payload shape."""

    names: tuple[str, str, str]  # delivery id, event and signature headers, for errors
    delivery_of: Callable[[Mapping[str, str]], tuple[str, str, str]]
    signature_valid: Callable[[bytes, str, str], bool]
    to_github: Callable[[str, dict[str, Any], str], dict[str, Any]] | None = None


def _github_delivery(headers: Mapping[str, str]) -> tuple[str, str, str]:
    return (headers.get("X-GitHub-Delivery", ""), headers.get("X-GitHub-Event", ""),
            headers.get("X-Hub-Signature-256", ""))


GITHUB = Dialect(("X-GitHub-Delivery", "X-GitHub-Event", "X-Hub-Signature-256"),
                 _github_delivery, signature_valid)
GITEA = Dialect(("X-Gitea-Delivery", "X-Gitea-Event", "X-Gitea-Signature"),
                gitea.delivery_of, gitea.signature_valid, gitea.to_github)


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


async def receive_webhook(request: web.Request) -> web.Response:
    services = request.app[SERVICES_KEY]
    try:  # GitHub caps a payload at 25 MB: everything it can send is taken
        body = await read_body(request, WEBHOOK_BODY_LIMIT, "the webhook body")
    except PayloadTooLarge as exc:
        log.warning("webhook refused: too large", extra={"reason": exc.message})
        return _error(exc.status, exc.code, exc.message)
    dialect = GITEA if services.settings.dialect == "gitea" else GITHUB
    guid, event, signature = dialect.delivery_of(request.headers)
    delivery_header, event_header, signature_header = dialect.names
    if not dialect.signature_valid(body, signature, services.settings.webhook_secret):
        log.warning("webhook refused: bad or missing signature",
                    extra={"delivery_id": guid, "event": event})
        return _error(401, "bad_signature",
                      f"{signature_header} is missing or does not match the webhook secret")
    if not guid or not event:
        return _error(400, "missing_headers", f"{delivery_header} and {event_header} are required")
    try:
        payload = json.loads(body)
    except ValueError:
        return _error(400, "bad_json", "the webhook body is not JSON")
    if not isinstance(payload, dict):
        return _error(400, "bad_json", "the webhook body must be a JSON object")
    if may_hold_surrogates(body) and lone_surrogate_at(payload) is not None:
        payload = replace_surrogates(payload)  # signed: kept, as text that can be stored
        body = json.dumps(payload).encode()
    if dialect.to_github is not None:  # the handlers read GitHub's shapes only
        try:
            payload = dialect.to_github(event, payload, services.bot_login)
            body = gitea.encode(payload)
        except Exception:  # malformed: queued as it came, it fails alone and dead-letters
            log.warning("webhook payload not in the forge's shape; queued as it came",
                        extra={"delivery_id": guid, "event": event}, exc_info=True)
    if services.is_own_event(payload) and not services.own_router.fetch(
            sansio.Event(payload, event=event, delivery_id=guid)):
        # the app's own write coming back (each PATCH of a mail sends `edited` and `labeled`),
        # which no handler reads: answered, not stored, so it costs no commit and no worker turn
        metrics.DELIVERIES.labels(event=event, outcome="ignored").inc()
        log.debug("webhook ignored: caused by the app itself",
                  extra={"delivery_id": guid, "event": event, "action": payload.get("action")})
        return web.json_response({"delivery": guid, "queued": False, "ignored": True},
                                 status=202)
    # signed, so the forge sent it: queued even when malformed (it then fails in the worker,
    # counts its attempts and ends in dead letters, and takes no other delivery with it)
    queued = await services.store.enqueue_delivery(guid, event, payload, body)
    installation_id = installation_of(payload)
    log.info("webhook accepted" if queued else "webhook redelivered: already recorded",
             extra={"delivery_id": guid, "installation_id": installation_id, "event": event,
                    "action": payload.get("action")})
    metrics.DELIVERIES.labels(event=event, outcome="received" if queued else "redelivered").inc()
    if queued:
        services.wake_worker()
    return web.json_response({"delivery": guid, "queued": queued}, status=202)
