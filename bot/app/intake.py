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

from bot.app.services import SERVICES_KEY
from bot.forge import gitea_events as gitea

log = logging.getLogger("vaultmail.intake")


def signature_valid(body: bytes, header: str | None, secret: str) -> bool:
    """Check `X-Hub-Signature-256` (sha256=<hex HMAC of the raw body>) in constant time."""
    if not header or not header.startswith("sha256="):
        return False
    expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
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
    body = await request.read()
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
    if dialect.to_github is not None:  # the handlers read GitHub's shapes only
        payload = dialect.to_github(event, payload, services.bot_login)
        body = gitea.encode(payload)
    queued = await services.store.enqueue_delivery(guid, event, payload, body)
    installation_id = (payload.get("installation") or {}).get("id")
    log.info("webhook accepted" if queued else "webhook redelivered: already recorded",
             extra={"delivery_id": guid, "installation_id": installation_id, "event": event,
                    "action": payload.get("action")})
    if queued:
        services.wake_worker()
    return web.json_response({"delivery": guid, "queued": queued}, status=202)
