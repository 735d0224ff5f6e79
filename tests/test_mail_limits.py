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


async def test_a_reply_the_forge_could_not_hold_is_refused_before_anything_is_posted(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """60,000 characters of mentions gain one invisible character each once defused: past the
    forge's 65,536. The reply is refused naming why, and nothing is on the forge, so the same
    key can be used again once the body is shorter."""
    sent = await tools("agent:builder")("mail_send", to="scout", subject="Names",
                                        body="Who should review?")
    ref = sent["mail"]["ref"]
    scout = tools("agent:scout")
    status, answer = await scout.raw("mail_reply", {"mail": ref, "body": "@a " * 20_000,
                                                    "idempotencyKey": "r-big"})
    assert status == 422 and answer["error"]["code"] == "body_too_long", answer
    assert "65,536" in answer["error"]["message"]
    assert await person("admin").comments(SCOUT_VAULT, sent["mail"]["number"]) == []
    shorter = await scout("mail_reply", mail=ref, body="@a and @b", idempotencyKey="r-big")
    assert shorter["mail"]["state"] == "mail:replied"


async def test_the_forge_refuses_a_body_longer_than_githubs_limit(
        embedded: Embedded, person: Any) -> None:
    """GitHub answers 422 "body is too long (maximum is 65536 characters)"; so does the
    local forge, for issues and comments alike."""
    admin = person("admin")
    body = await admin.call("POST", f"/repos/{SCOUT_VAULT}/issues",
                            {"title": "Long", "body": "x" * 65_537}, expect=422)
    assert body["errors"][0]["message"] == "body is too long (maximum is 65536 characters)"
    issue = await admin.open_issue(SCOUT_VAULT, "Short", "x" * 65_536)
    body = await admin.call("POST", f"/repos/{SCOUT_VAULT}/issues/{issue['number']}/comments",
                            {"body": "y" * 65_537}, expect=422)
    assert body["errors"][0]["field"] == "body"
