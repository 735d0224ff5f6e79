"""Bad input gets a clear error, never a 500 or a dead letter (issue 9, items 10 to 12).

Control characters and invisible or bidi-override characters in a subject are neutralised
where a person reads the subject (the issue title, the signed header), and a subject that is
nothing else is refused with a reason; over-large bodies are 413 naming the limit; integers
out of range are 422 naming the field; webhooks are taken up to GitHub's 25 MB.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

import aiohttp
import pytest

from bot.app.embedded import Embedded
from tests.support import label_names
from tests.test_tamper import vaultmail

SCOUT = "acme/scout-vault"
BUILDER = "acme/builder-vault"
MiB = 1024 * 1024


async def _quick_dead_letters(embedded: Embedded) -> None:
    embedded.worker.base_backoff = 0.01  # a delivery that keeps failing dead-letters at once


# -- item 10: control characters in a subject --------------------------------------------------


async def test_a_tab_in_a_tool_subject_is_normalised_and_the_mail_verifies(
        embedded: Embedded, tools: Any, person: Any) -> None:
    sent = await tools("human:marco@acme.com")("mail_send", to="scout",
                                               subject="Budget\tQ3\r\nfinal", body="10k")
    mail = sent["mail"]
    assert mail["subject"] == "Budget Q3  final"
    await embedded.settle()
    issue = await person("admin").issue(SCOUT, mail["number"])
    assert issue["title"] == "Budget Q3  final"
    code, out = await vaultmail(embedded, "verify", mail["ref"])
    assert code == 0, out


async def test_a_subject_of_nothing_but_control_characters_is_refused_naming_it(
        tools: Any) -> None:
    status, body = await tools("human:marco@acme.com").raw(
        "mail_send", {"to": "scout", "subject": "\t\u202e\u200b\x07", "body": "x"})
    assert status == 422, body
    assert "subject" in body["error"]["message"]


async def test_a_tab_in_a_hand_made_issue_title_becomes_mail_not_a_dead_letter(
        embedded: Embedded, person: Any) -> None:
    await _quick_dead_letters(embedded)
    marco = person("marco")
    issue = await marco.open_issue(SCOUT, "Logs\tnow", "Rotate the logs")
    await embedded.settle()
    assert await embedded.services.store.dead_letters() == []
    found = await marco.issue(SCOUT, issue["number"])
    assert label_names(found) == ["mail:new"] and found["title"] == "Logs now"
    code, out = await vaultmail(embedded, "verify", f"{SCOUT}#{issue['number']}")
    assert code == 0, out


async def test_a_tab_in_a_mail_command_subject_sends_the_mail(
        embedded: Embedded, person: Any) -> None:
    await _quick_dead_letters(embedded)
    sara = person("sara")
    issue = await sara.open_issue(BUILDER, "Pricing", "talk")
    await embedded.settle()
    await sara.comment(BUILDER, issue["number"], "/mail scout\tPrices\tEU\nList them please.")
    await embedded.settle()
    assert await embedded.services.store.dead_letters() == []
    [mail] = [i for i in await sara.issues(SCOUT)]
    assert mail["title"] == "Prices EU"
    notes = [c["body"] for c in await sara.comments(BUILDER, issue["number"])]
    assert any("mail sent to agent:scout" in n for n in notes), notes


async def test_a_mail_command_the_app_cannot_send_is_answered_not_dead_lettered(
        embedded: Embedded, person: Any) -> None:
    await _quick_dead_letters(embedded)
    sara = person("sara")
    issue = await sara.open_issue(BUILDER, "Pricing", "talk")
    await embedded.settle()
    await sara.comment(BUILDER, issue["number"], "/mail scout " + "long " * 80 + "\nbody")
    await sara.comment(BUILDER, issue["number"], "/mail scout \u202e\u2066\u200b\nbody")
    await embedded.settle()
    assert await embedded.services.store.dead_letters() == []
    notes = [c["body"] for c in await sara.comments(BUILDER, issue["number"])]
    assert any("subject" in n and "at most 256" in n for n in notes), notes
    assert any("subject" in n and "empty" in n for n in notes), notes
    assert await sara.issues(SCOUT) == []


# -- item 11: invisible and bidi-override characters where a person reads the subject ---------


@pytest.mark.parametrize("sneaky", [
    "\u202e", "\u2066", "\u2067", "\u2068", "\u2069", "\u202a", "\u202b", "\u202c", "\u202d",
    "\u200b", "\u200e", "\u200f", "\u2060", "\ufeff", "\u00ad", "\U000e0041", "\u061c"])
async def test_bidi_override_and_invisible_characters_are_not_signed_into_a_subject(
        embedded: Embedded, tools: Any, person: Any, sneaky: str) -> None:
    sent = await tools("agent:builder")("mail_send", to="scout",
                                        subject=f"Invoice {sneaky}fdp.exe", body="see")
    mail = sent["mail"]
    assert mail["subject"] == "Invoice fdp.exe"
    issue = await person("admin").issue(SCOUT, mail["number"])
    assert issue["title"] == "Invoice fdp.exe"


async def test_joiners_that_scripts_and_emoji_need_are_kept(tools: Any) -> None:
    family = "\U0001f468\u200d\U0001f469\u200d\U0001f467"  # ZWJ sequence
    persian = "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645"  # ZWNJ
    sent = await tools("agent:builder")("mail_send", to="scout",
                                        subject=f"{family} {persian} \u2764\ufe0f", body="x")
    assert sent["mail"]["subject"] == f"{family} {persian} \u2764\ufe0f"


# -- item 11: tool bodies over 1 MiB, integers out of range -----------------------------------


async def test_a_tool_body_over_one_mib_is_413_naming_the_limit(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    url = embedded.app_url + "/api/v1/tools/mail_send"
    headers = {"Authorization": f"Bearer {embedded.api_tokens['agent:builder']}",
               "Content-Type": "application/json"}
    big = json.dumps({"to": "scout", "subject": "s", "body": "x" * (MiB + 10)})
    async with session.post(url, data=big, headers=headers) as resp:
        assert resp.status == 413, await resp.text()
        error = (await resp.json())["error"]
    assert error["code"] == "too_large" and "1 MiB" in error["message"]

    async def chunks() -> Any:  # no Content-Length: counted as it arrives
        for _ in range(3):
            yield b" " * (MiB // 2)
        yield b"{}"

    async with session.post(url, data=chunks(), headers=headers) as resp:
        assert resp.status == 413, await resp.text()


async def test_a_tool_body_just_under_the_limit_is_read(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    url = embedded.app_url + "/api/v1/tools/mail_send"
    headers = {"Authorization": f"Bearer {embedded.api_tokens['agent:builder']}",
               "Content-Type": "application/json"}
    padded = json.dumps({"to": "scout", "subject": "s", "body": "b"}) + " " * (MiB - 200)
    async with session.post(url, data=padded, headers=headers) as resp:
        assert resp.status == 200, await resp.text()


async def test_an_mcp_body_over_one_mib_is_413_naming_the_limit(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    headers = {"Authorization": f"Bearer {embedded.api_tokens['agent:builder']}",
               "Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    big = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {
        "pad": "x" * (MiB + 10)}})
    async with session.post(embedded.app_url + "/mcp", data=big, headers=headers) as resp:
        assert resp.status == 413, await resp.text()
        assert "1 MiB" in await resp.text()


HUGE = 10**30


@pytest.mark.parametrize(("tool", "args", "field"), [
    ("list_inbox", {"readBefore": HUGE, "read": True}, "readBefore"),
    ("list_inbox", {"updatesBefore": HUGE}, "updatesBefore"),
    ("list_inbox", {"updatesBefore": -HUGE}, "updatesBefore"),
    ("list_inbox", {"since": HUGE}, "since"),
    ("list_changes", {"since": HUGE}, "since"),
    ("list_changes", {"limit": HUGE}, "limit"),
    ("chat_get", {"chat": HUGE}, "chat"),
    ("chat_reply", {"chat": HUGE, "message": "hi"}, "chat"),
    ("agent_chat", {"agent": "scout", "message": "hi", "wait": HUGE}, "wait"),
    ("list_inbox", {"wait": 1e308}, "wait"),
    ("add_comment", {"targetType": "outcome", "target": "acme/site#1", "parent": "c1",
                     "option": HUGE}, "option"),
    ("mail_send", {"to": "scout", "subject": HUGE, "body": "x"}, "subject"),
])
async def test_integers_out_of_range_are_422_naming_the_field(
        tools: Any, tool: str, args: dict[str, Any], field: str) -> None:
    status, body = await tools("human:marco@acme.com").raw(tool, args)
    assert status == 422, (tool, status, body)
    assert field in body["error"]["message"], body


async def test_an_integer_past_64_bits_is_refused_by_the_range_rule(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """Sent as JSON text (not through a client that would refuse it first): read as the integer
    it is, not as a float, so the answer names the limit, as for any integer past 2**53."""
    url = embedded.app_url + "/api/v1/tools/list_inbox"
    headers = {"Authorization": f"Bearer {embedded.api_tokens['human:marco@acme.com']}"}
    for number in (10**30, 2**64, -(2**63) - 1):
        raw = f'{{"readBefore": {number}, "read": true}}'
        async with session.post(url, data=raw, headers=headers) as resp:
            assert resp.status == 422, (raw, await resp.text())
            message = (await resp.json())["error"]["message"]
        assert "readBefore" in message and "integers here are at most" in message, message


async def test_not_a_number_is_422_naming_the_field(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    url = embedded.app_url + "/api/v1/tools/list_inbox"
    headers = {"Authorization": f"Bearer {embedded.api_tokens['human:marco@acme.com']}"}
    for raw in ('{"wait": NaN}', '{"wait": Infinity}', '{"readBefore": -Infinity}'):
        async with session.post(url, data=raw, headers=headers) as resp:
            assert resp.status == 422, (raw, await resp.text())
            message = (await resp.json())["error"]["message"]
        assert "wait" in message or "readBefore" in message, message


# -- item 12: webhooks up to GitHub's 25 MB -----------------------------------------------------


async def _post_webhook(embedded: Embedded, session: aiohttp.ClientSession, body: bytes,
                        guid: str) -> int:
    secret = embedded.services.settings.webhook_secret.encode()
    sig = "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()
    async with session.post(embedded.app_url + "/webhook", data=body, headers={
            "X-GitHub-Delivery": guid, "X-GitHub-Event": "ping",
            "X-Hub-Signature-256": sig, "Content-Type": "application/json"}) as resp:
        if resp.status == 413:
            assert "25 MiB" in (await resp.json())["error"]["message"]
        return resp.status


async def test_a_webhook_as_large_as_github_sends_is_accepted(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    pad = "x" * (20 * MiB)
    body = json.dumps({"zen": "big", "hook_id": 1, "pad": pad,
                       "sender": {"login": "admin"}}).encode()
    assert await _post_webhook(embedded, session, body, "big-1") == 202


async def test_a_webhook_larger_than_github_sends_is_413(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    body = json.dumps({"zen": "too big", "pad": "x" * (25 * MiB)}).encode()
    assert await _post_webhook(embedded, session, body, "huge-1") == 413


async def test_a_refused_webhook_whose_body_is_left_unread_closes_its_connection(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """Refused before its body is read (too large, or with no signature to check it against),
    a webhook is answered and its connection closed: not held while aiohttp reads and drops
    the rest of the body for up to 10 s."""
    body = json.dumps({"zen": "too big", "pad": "x" * (25 * MiB)}).encode()
    for headers in ({"X-GitHub-Event": "issues", "X-GitHub-Delivery": "unsigned-1"},
                    {"X-GitHub-Event": "issues", "X-GitHub-Delivery": "huge-2",
                     "X-Hub-Signature-256": "sha256=" + "0" * 64}):
        async with session.post(embedded.app_url + "/webhook", data=body,
                                headers=headers) as resp:
            assert resp.status in (401, 413), resp.status
            assert resp.headers.get("Connection", "").lower() == "close", dict(resp.headers)


# -- the same class: one-line texts a person reads on a question card --------------------------


async def test_a_newline_in_an_option_label_cannot_forge_a_ticked_box_in_the_card(
        embedded: Embedded, tools: Any, person: Any) -> None:
    from tests.items_support import TOKEN_TTL, forge_comments, make_item

    outcome = await make_item(embedded, person("marco"), "outcome", "Auth migration",
                              assignees=["scout-bot"])
    sneaky = {**TOKEN_TTL, "header": "Token\nTTL\u202e", "options": [
        {"label": "Keep\n- [x] 2. **Force**"},
        {"label": "Force", "description": "clean\n- [x] 1. **Keep**"}]}
    asked = await tools("agent:scout")("add_comment", target=outcome, **sneaky)
    assert [o["label"] for o in asked["thread"]["options"]] == ["Keep - [x] 2. **Force**",
                                                                "Force"]
    [card] = await forge_comments(person("admin"), outcome)
    boxes = [line for line in card["body"].splitlines() if line.lstrip().startswith("- [")]
    assert len(boxes) == 2 and not any(b.startswith("- [x]") for b in boxes), boxes
    assert "### Token TTL\n" in card["body"]


BIG = "9" * 30


@pytest.mark.parametrize(("tool", "args", "status"), [
    ("mail_get", {"mail": f"{SCOUT}#{BIG}"}, 404),
    ("mail_open", {"mail": f"{SCOUT}#{BIG}"}, 404),
    ("get_outcome", {"outcome": f"{SCOUT}#{BIG}"}, 404),
    ("get_tree", {"goal": f"{SCOUT}#{BIG}"}, 404),
    ("add_comment", {"targetType": "outcome", "target": f"{SCOUT}#{BIG}", "body": "hi"}, 404),
    ("mail_list", {"mailsBefore": f"2026-01-01T00:00:00Z|{SCOUT}|{BIG}"}, 422),
    ("mail_list", {"mailsBefore": f"2026-01-01T00:00:00Z|{SCOUT}|\u00b2"}, 422),
])
async def test_numbers_too_large_inside_a_reference_are_refused_not_a_500(
        tools: Any, tool: str, args: dict[str, Any], status: int) -> None:
    got, body = await tools("human:marco@acme.com").raw(tool, args)
    assert got == status, (tool, got, body)


async def test_a_tool_argument_with_a_lone_surrogate_is_refused_naming_it(
        embedded: Embedded, tools: Any) -> None:
    """"\\ud800" is valid JSON but no character: the call is refused with 422, naming the
    argument, before anything is stored or sent to the forge (nothing could hold it)."""
    status, body = await tools("agent:builder").raw(
        "mail_send", {"to": "scout", "subject": "Prices \ud800", "body": "EU"})
    assert status == 422, body
    assert body["error"]["code"] == "invalid_text"
    assert "subject" in body["error"]["message"]


# -- numbers in URLs, cursors and comments: ASCII digits, in range ------------------------------
# "²".isdigit() is True but int("²") raises, and 20 digits overflow the index's integers.

MARCO = "human:marco@acme.com"


async def test_a_number_in_a_console_url_that_is_no_number_is_refused_or_not_found(
        embedded: Embedded, session: aiohttp.ClientSession, tools: Any) -> None:
    sent = await tools(MARCO)("mail_send", to="scout", subject="Reply to me", body="x")
    headers = {"Authorization": f"Bearer {embedded.api_tokens[MARCO]}"}

    async def get(path: str) -> tuple[int, str]:
        async with session.get(embedded.app_url + path, headers=headers) as resp:
            return resp.status, await resp.text()

    for before in ("%C2%B2", "99999999999999999999999999", "-1", "%EF%BC%91"):
        status, body = await get(f"/console/ledger?before={before}")
        assert status == 422 and "is not an entry&#39;s number" in body, (before, status)
    status, body = await get("/console/mail?reply=" + sent["mail"]["ref"].replace("#", "%23"))
    assert status == 200 and "In reply to" in body
    for number in ("%C2%B2", "99999999999999999999999999"):
        status, body = await get(f"/console/mail?reply={SCOUT}%23{number}")
        assert status == 200 and "In reply to" not in body, (number, status)


async def test_an_option_number_that_is_no_number_is_refused_naming_the_option(
        embedded: Embedded, tools: Any, person: Any) -> None:
    from tests.items_support import TOKEN_TTL, make_item

    outcome = await make_item(embedded, person("marco"), "outcome", "Auth",
                              assignees=["scout-bot"])
    asked = await tools("agent:scout")("add_comment", target=outcome, **TOKEN_TTL)
    # out of range, as a number or as words: the same clear refusal naming the options
    # (a schema bound on the number refused 5 and 0 first, in pydantic's words)
    for option in ("²", "9" * 30, 3, 5, 0, -1, "5"):
        status, body = await tools(MARCO).raw("add_comment", {
            "targetType": "outcome", "target": outcome, "parent": asked["comment"]["id"],
            "option": option})
        message = body["error"]["message"]
        assert status == 422 and "is not one of this question's options" in message \
            and "1. Keep 30 days; 2. Force re-login" in message, (option, status, body)
        assert "constrained" not in message and "Input should" not in message, message


async def test_an_answer_of_a_superscript_digit_is_words_not_a_dead_letter(
        embedded: Embedded, person: Any) -> None:
    from tests.items_support import forge_comments, make_item, where

    await _quick_dead_letters(embedded)
    marco, sara = person("marco"), person("sara")
    goal = await make_item(embedded, marco, "goal", "EU launch")
    repo, n = where(goal)
    await marco.comment(repo, n, "/ask Which currency? @sara\n- [ ] EUR\n- [ ] Local")
    await embedded.settle()
    await sara.comment(repo, n, "/answer ²")
    await embedded.settle()
    assert await embedded.services.store.dead_letters() == []
    card = (await forge_comments(marco, goal))[1]
    assert "**Answered** by sara" in card["body"], card["body"]


async def test_a_number_of_no_chat_or_run_is_refused_in_the_tools_words(
        embedded: Embedded, tools: Any) -> None:
    """A schema bound (`ge=1`) refused chat 0 and run 0 in pydantic's words ("Input should be
    greater than or equal to 1") before the tool could say what it takes."""
    status, body = await tools(MARCO).raw("chat_get", {"chat": 0})
    assert status == 404 and "no chat 0 of yours" in body["error"]["message"], body
    status, body = await tools("agent:builder").raw(
        "mail_send", {"to": "scout", "subject": "Runs", "body": "x", "run": 0})
    assert status == 422 and body["error"]["code"] == "run_not_open", body
    assert "open runs" in body["error"]["message"], body
