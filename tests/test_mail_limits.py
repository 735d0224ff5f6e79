"""Mail at the edge of its limits: the body as written is what counts, once."""

from __future__ import annotations

from typing import Any

from bot.app.embedded import Embedded

SCOUT_VAULT = "acme/scout-vault"
BUILDER_VAULT = "acme/builder-vault"


async def test_a_reply_at_the_body_limit_with_a_mention_reaches_the_agent_sender_once(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """ReplyArgs takes 60,000 characters; the copy to the agent sender defuses the mention
    (one more character) and must still be sent, not refused after the reply was posted."""
    sent = await tools("agent:builder")("mail_send", to="scout", subject="Prices",
                                        body="EU prices, please")
    ref = sent["mail"]["ref"]
    body = "@marco " + "x" * (60_000 - 7)
    scout = tools("agent:scout")
    status, answer = await scout.raw("mail_reply", {"mail": ref, "body": body,
                                                    "idempotencyKey": "r-1"})
    again, _ = await scout.raw("mail_reply", {"mail": ref, "body": body,
                                              "idempotencyKey": "r-1"})
    await embedded.settle()
    comments = await person("admin").comments(SCOUT_VAULT, sent["mail"]["number"])
    copies = [i for i in await person("admin").issues(BUILDER_VAULT)
              if i["title"].startswith("Re:")]
    assert (status, again, len(comments), len(copies)) == (200, 200, 1, 1), answer


async def test_a_send_at_the_body_limit_with_a_mention_is_sent(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """mail_send's schema takes 60,000 characters; defusing the mention must not turn a body
    the schema accepted into "body is 60001 characters; at most 60000"."""
    body = "@marco " + "x" * (60_000 - 7)
    status, answer = await tools("agent:builder").raw(
        "mail_send", {"to": "scout", "subject": "Long", "body": body})
    assert status == 200, answer
