"""The console in a real browser (Debian's Chromium, driven by Playwright): signing in through
the forge's OAuth web flow, sending mail, answering and deferring cards, chatting with an agent,
a phone-sized screen; axe-core finds no serious or critical violation on any page."""

from __future__ import annotations

import re
from typing import Any

import aiohttp
import pytest
from playwright.async_api import BrowserContext, expect

from bot.app.embedded import Embedded
from tests.console.browser import (
    PHONE,
    assert_accessible,
    live,
    shot,
    sign_in_with_forge,
    sign_in_with_token,
)
from tests.items_support import BUILDER, MARCO, SARA, SCOUT, TOKEN_TTL, forge_comments, make_item
from tests.support import Actor, ToolClient, label_names

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_a_person_signs_in_with_their_forge_account(office: Embedded,
                                                          context: BrowserContext) -> None:
    page = await context.new_page()
    await sign_in_with_forge(page, office, "marco")
    await expect(page.get_by_role("heading", name="Inbox", level=1)).to_be_visible()
    await expect(page.get_by_text("Signed in as marco")).to_be_visible()
    await live(page)
    await assert_accessible(page)
    cookies = {c["name"]: c for c in await context.cookies(office.app_url + "/console/")}
    session = cookies["vaultmail_session"]
    assert session["httpOnly"] and session["sameSite"] == "Lax"
    await page.get_by_role("button", name="Sign out").click()
    await expect(page).to_have_url(re.compile(r"/console/sign-in\?out=1$"))
    await page.goto(office.app_url + "/console/mail")
    await expect(page).to_have_url(re.compile(r"/console/sign-in\?next="))


async def test_a_person_sends_mail_from_the_mail_page(office: Embedded,
                                                      context: BrowserContext) -> None:
    page = await context.new_page()
    await sign_in_with_forge(page, office, "marco")
    await page.get_by_role("link", name="Mail", exact=True).click()
    await page.get_by_label("To").select_option("scout")
    await page.get_by_label("Subject").fill("EU prices")
    await page.get_by_label("Message").fill("Can you check the **EU** prices by Friday?")
    await page.get_by_role("button", name="Send", exact=True).click()
    await expect(page.locator(".flash")).to_contain_text("Sent to agent:scout: "
                                                        "acme/scout-vault#1")
    await office.settle()
    async with aiohttp.ClientSession() as http:
        [issue] = await Actor(http, office, "marco").issues("acme/scout-vault")
    assert issue["title"] == "EU prices" and "mail:new" in label_names(issue)
    assert "Can you check the **EU** prices by Friday?" in issue["body"]
    assert '"from_principal":"human:marco@acme.com"' in issue["body"], "the signed header"

    async with aiohttp.ClientSession() as http:  # mail between agents, one changed by hand
        builder, scout = ToolClient(http, office, BUILDER), ToolClient(http, office, SCOUT)
        spec = await builder("mail_send", to="scout", subject="Spec v1", body="Attached.")
        await scout("mail_reply", mail=spec["mail"]["ref"], body="Looks good, one question.")
        budget = await builder("mail_send", to="scout", subject="Budget", body="10k")
        admin = Actor(http, office, "admin")
        vault, number = "acme/scout-vault", budget["mail"]["number"]
        issue = await admin.issue(vault, number)
        await admin.call("PATCH", f"/repos/{vault}/issues/{number}",
                         {"body": issue["body"].replace("10k", "90k")}, expect=200)
        await office.settle()
    await page.reload()
    thread = page.locator(".thread", has_text="EU prices")
    await expect(thread).to_contain_text("mail:new")
    await expect(thread).to_contain_text("Signature verified")
    spec_thread = page.locator(".thread", has_text="Spec v1")
    await expect(spec_thread.locator(".message")).to_have_count(2)  # the mail, the reply copy
    await expect(spec_thread.locator(".message").nth(0)).to_contain_text("mail:replied")
    await expect(spec_thread.locator(".message").nth(1)).to_contain_text("scout → builder")
    await expect(page.locator(".thread", has_text="Budget")).to_contain_text(
        "Changed after sending")
    await assert_accessible(page)
    await shot(page, "console-mail.png")

    await page.get_by_label("Agent").select_option("builder")
    await page.get_by_label("Text").fill("spec")
    await page.get_by_role("button", name="Filter").click()
    await expect(page.locator(".thread")).to_have_count(1)
    await expect(page.locator(".thread")).to_contain_text("Spec v1")
    await page.get_by_label("State").select_option("closed")
    await page.get_by_role("button", name="Filter").click()
    await expect(page.get_by_text("No mail matches these filters.")).to_be_visible()
    await page.goto(office.app_url + "/console/mail")

    await thread.get_by_role("link", name="EU prices").click()
    await expect(page.get_by_role("heading", name="EU prices", level=1)).to_be_visible()
    await expect(page.locator("article.mail strong", has_text="EU")).to_be_visible()
    await assert_accessible(page)
    await page.get_by_role("link", name="acme/scout-vault#1 on the forge").first.click()
    await expect(page).to_have_url(f"{office.forge.url}/acme/scout-vault/issues/1")
    await expect(page.get_by_text("Can you check the")).to_be_visible()


async def test_a_person_without_mail_send_sees_why(office: Embedded,
                                                   context: BrowserContext) -> None:
    page = await context.new_page()
    await sign_in_with_forge(page, office, "lee")
    await page.get_by_role("link", name="Mail", exact=True).click()
    await expect(page.get_by_text("You cannot send mail: human:lee@acme.com lacks the "
                                  "mail.send permission")).to_be_visible()
    await expect(page.get_by_role("button", name="Send", exact=True)).to_have_count(0)
    await assert_accessible(page)


async def test_a_person_answers_a_question_from_the_card_stack(office: Embedded,
                                                               context: BrowserContext) -> None:
    async with aiohttp.ClientSession() as http:
        marco, scout = Actor(http, office, "marco"), ToolClient(http, office, SCOUT)
        outcome = await make_item(office, marco, "outcome", "Auth migration",
                                  assignees=["scout-bot"])
        page = await context.new_page()
        await sign_in_with_forge(page, office, "marco")
        await live(page)
        await expect(page.get_by_text("Nothing waits on you.")).to_be_visible()

        asked = await scout("add_comment", target=outcome, **TOKEN_TTL)  # while the page is open
        card = page.locator("article.card")
        await expect(card.get_by_role("heading", name="Token TTL")).to_be_visible()
        await expect(page.locator("#badge")).to_have_text("1")
        await expect(card).to_contain_text("should existing sessions keep working?")
        context_text = card.get_by_text("Today about 40,000 people are signed in.")
        await expect(context_text).to_be_hidden()
        await card.get_by_text("Context", exact=True).click()
        await expect(context_text).to_be_visible()
        keep = card.get_by_role("button", name=re.compile("^Keep 30 days"))
        await expect(keep).to_contain_text("Recommended")
        await expect(keep).to_contain_text("Nobody is signed out")
        await assert_accessible(page)
        await shot(page, "console-inbox.png")

        await card.get_by_role("button", name=re.compile("^Force re-login")).click()
        await expect(page.locator(".flash")).to_contain_text("“Force re-login”")
        await expect(page.get_by_text("Nothing waits on you.")).to_be_visible()
        await office.settle()

        forge_card, *replies = await forge_comments(Actor(http, office, "admin"), outcome)
        assert "- [x] 2. **Force re-login**" in forge_card["body"]
        assert any("Force re-login" in c["body"] for c in replies), "the answer, as a reply"
        assert "**Answered** by marco" in forge_card["body"]
        back = (await scout("list_inbox"))["agents"]["yourTurn"]
        [reply] = [t for t in back if t["thread"] == asked["comment"]["id"]]
        assert reply["turn"] == "replied" and reply["answer"]["option"] == "Force re-login"
        assert reply["answer"]["by"] == MARCO and reply["answer"]["then"].startswith("Invalidate")

        # an answered one can still change: amend, from "You answered"
        answered = page.locator("details.item", has_text="Token TTL")
        await answered.get_by_text("Token TTL").click()
        await answered.get_by_role("button", name="Keep 30 days").click()
        await expect(page.locator(".flash")).to_contain_text("changed to “Keep 30 days”")
        await office.settle()
        forge_card, *_ = await forge_comments(Actor(http, office, "admin"), outcome)
        assert "- [x] 1. **Keep 30 days**" in forge_card["body"]


async def test_a_deferred_card_comes_back_after_the_others(office: Embedded,
                                                           context: BrowserContext) -> None:
    async with aiohttp.ClientSession() as http:
        marco, scout = Actor(http, office, "marco"), ToolClient(http, office, SCOUT)
        outcome = await make_item(office, marco, "outcome", "Pricing", assignees=["scout-bot"])
        for header in ("Launch date", "EU first"):
            await scout("add_comment", targetType="outcome", target=outcome, header=header,
                        to=["marco@acme.com"], body=f"{header}?",
                        options=[{"label": "Yes"}, {"label": "No"}])
        page = await context.new_page()
        await sign_in_with_forge(page, office, "marco")
        card = page.locator("article.card")
        first = await card.locator("h3").inner_text()
        second = {"Launch date": "EU first", "EU first": "Launch date"}[first]
        await expect(card).to_contain_text("1 more in your stack")

        await card.get_by_role("button", name="Defer").click()
        await expect(card.locator("h3")).to_have_text(second)
        await expect(card.get_by_role("listitem")).to_have_text(f"{first} (deferred)")
        await page.reload()
        await expect(card.locator("h3")).to_have_text(second), "set aside across reloads"

        await card.get_by_label("Or reply in words").fill("Not before we hear from legal")
        await card.get_by_role("button", name="Send reply").click()
        await expect(card.locator("h3")).to_have_text(first)
        await expect(card).to_contain_text("You deferred this one")
        await card.get_by_role("button", name=re.compile("^Yes")).click()
        await expect(page.get_by_text("Nothing waits on you.")).to_be_visible()
        await office.settle()
        answers = {t["header"]: t["answer"] for t in
                   (await scout("list_inbox"))["agents"]["yourTurn"]}
        assert answers[second]["body"] == "Not before we hear from legal"
        assert answers[first]["option"] == "Yes"


async def test_a_person_chats_with_an_agent_on_its_desk(office: Embedded,
                                                        context: BrowserContext) -> None:
    page = await context.new_page()
    await sign_in_with_forge(page, office, "marco")
    await page.get_by_role("navigation").get_by_role("link", name="scout").click()
    await expect(page.get_by_role("heading", name="scout's desk")).to_be_visible()
    await live(page)
    await page.get_by_label("Ask scout").fill("EU or US first?")
    await page.get_by_role("button", name="Ask", exact=True).click()
    chat = page.locator("#chat-live")
    await expect(chat).to_contain_text("EU or US first?")
    await expect(chat).to_contain_text("scout has not answered yet")
    await live(page)
    async with aiohttp.ClientSession() as http:  # scout answers while the page stays open
        scout = ToolClient(http, office, SCOUT)
        [waiting] = (await scout("list_inbox"))["inbox"]["chats"]
        assert waiting["message"] == "EU or US first?" and waiting["from"] == MARCO
        await scout("chat_reply", chat=waiting["chat"], message="EU: the pricing is ready")
    await expect(chat).to_contain_text("scout: EU: the pricing is ready")
    await expect(chat).not_to_contain_text("has not answered yet")
    runs = page.locator("section", has=page.locator("#desk-runs"))
    await page.reload()
    await expect(runs).to_contain_text("chat")
    await expect(runs).to_contain_text("queued")
    await expect(page.locator("section", has=page.locator("#desk-ledger"))).to_contain_text(
        "run.queued")
    await assert_accessible(page)


async def test_a_local_agent_answers_a_chat_by_itself(office: Embedded,
                                                      context: BrowserContext) -> None:
    page = await context.new_page()
    await sign_in_with_forge(page, office, "sara")
    await page.goto(office.app_url + "/console/agents/echo")
    await page.get_by_label("Ask echo").fill("Are you there?")
    await page.get_by_role("button", name="Ask", exact=True).click()
    # echo runs as a command per chat and answers through the tools
    await expect(page.locator("#chat-live")).to_contain_text("Echo: Are you there?",
                                                             timeout=30_000)
    await office.settle()
    await page.reload()
    runs = page.locator("section", has=page.locator("#desk-runs"))
    await expect(runs).to_contain_text("done")
    await expect(runs).to_contain_text("exit 0")


async def test_the_console_on_a_phone_and_by_keyboard_alone(office: Embedded,
                                                            context: BrowserContext) -> None:
    async with aiohttp.ClientSession() as http:
        marco, scout = Actor(http, office, "marco"), ToolClient(http, office, SCOUT)
        outcome = await make_item(office, marco, "outcome", "Auth", assignees=["scout-bot"])
        await scout("add_comment", target=outcome, **TOKEN_TTL)
        await ToolClient(http, office, MARCO)("mail_send", to="scout", subject="Phone check",
                                              body="A mail to list")
    page = await context.new_page()
    await page.set_viewport_size(PHONE)
    await sign_in_with_forge(page, office, "marco")
    for path in ("/console/inbox", "/console/mail", "/console/agents/scout", "/console/ledger",
                 "/console/held"):
        await page.goto(office.app_url + path)
        wide = await page.evaluate("document.documentElement.scrollWidth")
        assert wide <= PHONE["width"], (path, wide, "no sideways scrolling on a phone")
        await expect(page.get_by_role("navigation", name="Console")).to_be_visible()
        await assert_accessible(page)

    await page.goto(office.app_url + "/console/inbox")
    await shot(page, "console-phone.png")
    await page.keyboard.press("Tab")
    await expect(page.get_by_role("link", name="Skip to content")).to_be_focused()
    await page.keyboard.press("Enter")
    keep = page.get_by_role("button", name=re.compile("^Keep 30 days"))
    for _ in range(40):  # Tab through the page, as someone without a mouse does
        if await keep.evaluate("el => el === document.activeElement"):
            break
        await page.keyboard.press("Tab")
    await expect(keep).to_be_focused()
    await page.keyboard.press("Enter")
    await expect(page.locator(".flash")).to_contain_text("“Keep 30 days”")


async def test_forge_accounts_outside_the_office_people_are_turned_away(
        office: Embedded, context: BrowserContext) -> None:
    office.forge.add_user("stranger", email="stranger@example.com")
    for login, why in (("stranger", "the forge account stranger is not one of the office's "
                                    "people"),
                       ("scout-bot", "the console is for the office's people, and agent:scout "
                                     "is not one of them")):
        page = await context.new_page()
        await page.goto(office.app_url + f"/console/sign-in?login={login}")  # as `up` prints
        await page.get_by_role("link", name=f"Sign in with the forge as {login}").click()
        await expect(page.get_by_label("Username or email address")).to_have_value(login)
        await page.get_by_label("Password").fill(office.forge.user_password(login))
        await page.get_by_role("button", name="Sign in").click()
        await page.get_by_role("button", name=re.compile("^Authorize")).click()
        await expect(page.get_by_role("alert")).to_contain_text(why)
        await expect(page).to_have_url(re.compile(r"/console/oauth/callback"))
        assert "vaultmail_session" not in {c["name"] for c in await context.cookies(
            office.app_url + "/console/")}
        await page.close()


async def test_the_ledger_on_a_phone_shows_each_entry_whole(office: Embedded,
                                                          context: BrowserContext) -> None:
    """At 390 px each entry is a block of its fields, subject and data in view, not a table
    squeezed sideways with its last columns off-screen."""
    async with aiohttp.ClientSession() as http:
        await ToolClient(http, office, MARCO)("mail_send", to="scout", subject="Phone ledger",
                                              body="An entry with a subject")
    page = await context.new_page()
    await page.set_viewport_size(PHONE)
    await sign_in_with_forge(page, office, "marco")
    await page.goto(office.app_url + "/console/ledger")
    row = page.locator("table.ledger tbody tr").first
    for column, n in (("Subject", 4), ("Data", 5)):
        cell = row.locator("td").nth(n)
        await expect(cell).to_be_visible()
        box = await cell.bounding_box()
        assert box is not None and box["x"] >= 0, column
        assert box["x"] + box["width"] <= PHONE["width"], (column, box)
        assert box["width"] >= PHONE["width"] / 2, (column, box, "not squeezed")
    await expect(row.locator("td").nth(4)).to_contain_text("acme/scout-vault")
    await assert_accessible(page)


async def test_the_inbox_and_a_desk_read_as_they_should_in_the_browser(
        office: Embedded, context: BrowserContext) -> None:
    """The smaller items of issue 23, as a person sees and hears them: an option without a
    description is announced by its label alone; a question waiting on marco is one card, not
    also a line under "Your agents are handling"; an answer by option alone says which option
    there, not a bare link; critic's desk (it takes no chat runs) offers no chat."""
    async with aiohttp.ClientSession() as http:
        outcome = await make_item(office, Actor(http, office, "marco"), "outcome", "Launch",
                                  assignees=["scout-bot"])
        scout = ToolClient(http, office, SCOUT)
        await scout("add_comment", targetType="outcome", target=outcome, header="Launch date",
                    to=["marco@acme.com"], body="Launch on Monday?",
                    options=[{"label": "Yes"}, {"label": "No", "description": "A week later"}])
        asked = await scout("add_comment", targetType="outcome", target=outcome,
                            header="Budget", to=["sara@acme.com"], body="Budget?",
                            options=[{"label": "10k"}, {"label": "20k"}])
        await ToolClient(http, office, "human:sara@acme.com")(
            "add_comment", targetType="outcome", target=outcome,
            parent=asked["thread"]["thread"], option=2, body="")
        await office.settle()
    page = await context.new_page()
    await sign_in_with_forge(page, office, "marco")
    card = page.locator("article.card")
    await expect(card.get_by_role("button", name="Yes", exact=True)).to_be_visible()
    await expect(card.get_by_role("button", name=re.compile(r"^No\b"))
                 ).to_have_accessible_description("A week later")
    await expect(page.get_by_text("No description")).to_have_count(0)
    history = page.locator("section.history")
    await expect(history).not_to_contain_text("Launch date")  # the card is the one place
    await expect(history).to_contain_text("Chose “20k”")
    await assert_accessible(page)
    await page.goto(office.app_url + "/console/agents/critic")
    await expect(page.get_by_role("heading", name="critic's desk")).to_be_visible()
    await expect(page.get_by_label("Ask critic")).to_have_count(0)


async def test_only_the_person_looking_marks_their_inbox_read(office: Embedded,
                                                              context: BrowserContext) -> None:
    """Another site sending marco's browser to his inbox (SameSite=Lax sends his session's
    cookie on a top-level navigation from anywhere) marks nothing read: he has not seen it. The
    Inbox link of a console page does, and so does the address typed or bookmarked."""
    page = await context.new_page()
    await sign_in_with_token(page, office, MARCO)
    await expect(page.get_by_text("No unread comments.")).to_be_visible()
    other_site = office.app_url.replace("127.0.0.1", "localhost")  # not 127.0.0.1's site
    await page.goto(other_site + "/console/static/console.css")  # (the inbox left: not open)
    async with aiohttp.ClientSession() as http:
        marco = ToolClient(http, office, MARCO)
        outcome = await make_item(office, Actor(http, office, "marco"), "outcome", "Auth",
                                  assignees=["scout-bot"])

        async def unread() -> list[str]:
            return [c["body"] for c in
                    (await marco("list_inbox", markRead=False))["you"]["unread"]]

        for body in ("Secret for Marco", "Another for Marco"):
            await ToolClient(http, office, SARA)("add_comment", targetType="outcome",
                                                 target=outcome, body=body, to=["marco@acme.com"])
        await office.settle()
        await page.evaluate(f"window.location = {office.app_url + '/console/inbox'!r}")
        await page.wait_for_url(office.app_url + "/console/inbox")
        assert sorted(await unread()) == ["Another for Marco", "Secret for Marco"]
        await expect(page.locator("li.comment.unread")).to_have_count(2)  # shown, still unread

        await page.get_by_role("link", name=re.compile("^Inbox")).click()  # the console's own
        await page.wait_for_load_state()
        assert await unread() == []
        # the inbox left first: open, its own script would fetch "Typed" when it came and
        # mark it read before the typed address is even loaded (CI, Chromium 156)
        await page.goto(office.app_url + "/console/static/console.css")
        await ToolClient(http, office, SARA)("add_comment", targetType="outcome",
                                             target=outcome, body="Typed", to=["marco@acme.com"])
        await office.settle()
        await page.goto(office.app_url + "/console/inbox")  # typed or bookmarked
        await expect(page.locator("li.comment.unread")).to_have_count(1)
        assert await unread() == []


async def test_an_image_in_someones_words_marks_nothing_read(office: Embedded,
                                                             context: BrowserContext) -> None:
    """A comment drawn on a console page may hold an image whose address is the console's own
    (`![](/console/inbox?part=live)`): the browser fetches it from the page, same-origin and
    with the person's cookie, and that fetch marked every unread comment read (acted out,
    review r9: another site sent marco to his inbox, which marked nothing, and sara's image
    then did). Only a page the person navigates to, or the page's own script, marks read
    (`Sec-Fetch-Dest` document or empty, the script's `X-Requested-With`): never an image."""
    page = await context.new_page()
    await sign_in_with_token(page, office, MARCO)
    await expect(page.get_by_text("No unread comments.")).to_be_visible()
    other_site = office.app_url.replace("127.0.0.1", "localhost")
    await page.goto(other_site + "/console/static/console.css")
    async with aiohttp.ClientSession() as http:
        marco = ToolClient(http, office, MARCO)
        outcome = await make_item(office, Actor(http, office, "marco"), "outcome", "Auth",
                                  assignees=["scout-bot"])

        async def unread() -> list[str]:
            return [c["body"] for c in
                    (await marco("list_inbox", markRead=False))["you"]["unread"]]

        sara = ToolClient(http, office, SARA)
        await sara("add_comment", targetType="outcome", target=outcome,
                   body="Secret for Marco", to=["marco@acme.com"])
        await sara("add_comment", targetType="outcome", target=outcome,
                   body="nice ![](/console/inbox?part=live)", to=["marco@acme.com"])
        await office.settle()
        await page.evaluate(f"window.location = {office.app_url + '/console/inbox'!r}")
        await page.wait_for_url(office.app_url + "/console/inbox")
        await page.wait_for_function(
            "[...document.images].some(i => i.src.includes('part=live') && i.complete)")
        assert sorted(await unread()) == ["Secret for Marco",
                                          "nice ![](/console/inbox?part=live)"]


async def test_an_image_in_someones_words_opens_no_stream_and_starts_no_sign_in(
        office: Embedded, context: BrowserContext) -> None:
    """`img-src 'self'` lets someone's words draw an image whose address is the console's own
    (`![](/console/events)`, `![](/console/sign-in/forge)`), fetched by the reader's browser
    with their cookie: the first opened a live stream (one of the person's 8), the second
    started a sign-in with the forge (one of the address's 30 a minute, and a new OAuth state
    cookie over the one of a sign-in under way). A GET that acts is refused now to anything
    but a page navigated to (`Sec-Fetch-Dest: document`) or a script's fetch or EventSource
    (`empty`), as Chromium sends them: the console's own stream still opens."""
    from bot.console import live as live_streams

    page = await context.new_page()
    sent: dict[str, list[dict[str, str]]] = {}

    async def seen(request: Any) -> None:
        path = request.url.removeprefix(office.app_url).partition("?")[0]
        sent.setdefault(path, []).append(await request.all_headers())

    page.on("request", seen)
    await sign_in_with_token(page, office, MARCO)
    await live(page)
    async with aiohttp.ClientSession() as http:
        outcome = await make_item(office, Actor(http, office, "marco"), "outcome", "Auth",
                                  assignees=["scout-bot"])
        await ToolClient(http, office, SARA)(
            "add_comment", targetType="outcome", target=outcome, to=["marco@acme.com"],
            body="look ![](/console/events?x=1) ![](/console/sign-in/forge?next=/console/mail)")
        await office.settle()
    async with page.expect_response(lambda r: "/console/events?x=1" in r.url) as stream, \
            page.expect_response(lambda r: "/console/sign-in/forge?" in r.url) as start:
        await page.reload()
    await live(page)
    # Chromium's own: a navigation is `document`, the page's EventSource `empty` (its
    # fetches are too, which test_only_the_person_looking_marks_their_inbox_read stands on;
    # Playwright does not always show their Sec-Fetch-*)
    assert {h.get("sec-fetch-dest") for h in sent["/console/inbox"]
            if h.get("sec-fetch-mode") == "navigate"} == {"document"}, sent["/console/inbox"]
    assert {(h.get("sec-fetch-dest"), h.get("sec-fetch-mode")) for h in sent["/console/events"]
            } >= {("empty", "cors"), ("image", "no-cors")}, sent["/console/events"]
    assert [c["name"] for c in await context.cookies()
            if c["name"].endswith("vaultmail_oauth")] == [], "no sign-in started"
    assert office.runner.app[live_streams.STREAMS].held("acme", MARCO) == 1, "the page's own"
    assert (await stream.value).status == 403 and (await start.value).status == 403


async def test_a_sign_in_link_too_long_for_its_cookie_says_so(office: Embedded,
                                                             context: BrowserContext) -> None:
    """A console link of a few KB (`next=` the page to come back to after signing in): the
    forge sign-in kept it in its state cookie, past the 4,096 bytes Chromium keeps of one, so
    the browser kept none, and after the forge's sign-in and authorize the console said
    "This sign-in did not start here". Now the start says what was wrong and what to do, and
    signing in from there lands on the inbox."""
    page = await context.new_page()
    await page.goto(office.app_url + "/console/mail?q=" + "x" * 4000)
    await expect(page).to_have_url(re.compile(r"/console/sign-in\?next="))
    await page.get_by_role("link", name="Sign in with the forge").click()
    await expect(page.get_by_role("alert")).to_contain_text("next=")
    await expect(page.get_by_role("alert")).to_contain_text("sign in")
    await page.get_by_role("link", name="Sign in with the forge").click()
    await page.get_by_label("Username or email address").fill("marco")
    await page.get_by_label("Password").fill(office.forge.user_password("marco"))
    await page.get_by_role("button", name="Sign in").click()
    await page.get_by_role("button", name=re.compile("^Authorize")).click()
    await expect(page).to_have_url(re.compile(r"/console/inbox$"))
