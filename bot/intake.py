"""Webhook intake: verify, dedupe by delivery id, persist, answer at once.

Nothing is stored for a delivery whose signature does not verify. The worker does the rest.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging

from aiohttp import web

from bot.services import SERVICES_KEY

log = logging.getLogger("vaultmail.intake")


def signature_valid(body: bytes, header: str | None, secret: str) -> bool:
    """Check `X-Hub-Signature-256` (sha256=<hex HMAC of the raw body>) in constant time."""
    if not header or not header.startswith("sha256="):
        return False
    expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, header)


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


async def receive_webhook(request: web.Request) -> web.Response:
    services = request.app[SERVICES_KEY]
    body = await request.read()
    guid = request.headers.get("X-GitHub-Delivery", "")
    event = request.headers.get("X-GitHub-Event", "")
    if not signature_valid(body, request.headers.get("X-Hub-Signature-256"),
                           services.settings.webhook_secret):
        log.warning("webhook refused: bad or missing signature",
                    extra={"delivery_id": guid, "event": event})
        return _error(401, "bad_signature",
                      "X-Hub-Signature-256 is missing or does not match the webhook secret")
    if not guid or not event:
        return _error(400, "missing_headers", "X-GitHub-Delivery and X-GitHub-Event are required")
    try:
        payload = json.loads(body)
    except ValueError:
        return _error(400, "bad_json", "the webhook body is not JSON")
    if not isinstance(payload, dict):
        return _error(400, "bad_json", "the webhook body must be a JSON object")
    queued = await services.store.enqueue_delivery(guid, event, payload, body)
    installation_id = (payload.get("installation") or {}).get("id")
    log.info("webhook accepted" if queued else "webhook redelivered: already recorded",
             extra={"delivery_id": guid, "installation_id": installation_id, "event": event,
                    "action": payload.get("action")})
    if queued:
        services.worker.wake()
    return web.json_response({"delivery": guid, "queued": queued}, status=202)
