"""Read paths name no item in a repository the reader cannot see: an item's JSON names its
parent (and a plan takes its outcome's claim), an outcome's "Waiting on" on the forge names who
its questions wait on, and an update names the plan it tells of (found by review r1, after
test_item_updates.py). A hidden ref is left out, never replaced by a hint that it exists.

The staging is test_item_updates.py's: lee is in the office and assigned to an outcome in
scout's vault, and is no collaborator of the private `acme/secret`; marco and sara may read
it."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from bot.app.embedded import Embedded
from bot.store import comments as db
from bot.store import ledger
from tests.items_support import BUILDER, LEE, MARCO, SARA, forge_comments, make_item, where
from tests.support import Actor
from tests.test_item_updates import SECRET, WORDS, _leaks, _secret_plan, _stage
from tests.test_left_the_office import _without
from tests.test_reindex import _drop_work, _reindex
from tests.test_work_graph_waiting import blocked_by, waiting_by_dependency


async def _vault_plan_of_hidden(embedded: Embedded, s: Any, holder: str = "builder-bot"
                                ) -> tuple[str, str]:
    """marco's outcome in private acme/secret, claimed by `holder`, and a plan in scout's
    vault `Part of` it: (the outcome, the plan)."""
    hidden = await make_item(embedded, s.marco, "outcome", f"{WORDS}: outcome", repo=SECRET,
                             assignees=[holder])
    plan = await make_item(embedded, s.marco, "plan", "Price list: plan",
                           body=f"Part of {hidden}")
    return hidden, plan


async def test_an_outcome_shows_no_parent_in_a_repository_the_reader_cannot_see(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """A native sub-issue parent: the outcome's body does not name it, its JSON did."""
    s = await _stage(embedded, person, tools)
    goal = await make_item(embedded, s.marco, "goal", f"{WORDS}: goal", repo=SECRET)
    repo, n = where(s.outcome)
    child = await s.marco.call("GET", f"/repos/{repo}/issues/{n}", expect=200)
    g_repo, g_n = where(goal)
    await s.marco.call("POST", f"/repos/{g_repo}/issues/{g_n}/sub_issues",
                       {"sub_issue_id": child["id"]}, expect=201)
    await embedded.settle()
    seen = await tools(LEE)("get_outcome", outcome=s.outcome)
    assert not _leaks(seen), seen
    assert seen["outcome"]["parent"] is None and seen["goals"] == []
    assert (await tools(SARA)("get_outcome", outcome=s.outcome))["outcome"]["parent"] == goal


async def _read(embedded: Embedded, session: aiohttp.ClientSession, who: str,
                ref: str) -> dict[str, Any]:
    """The item resource, as `vaultmail mcp` reads it for `who`."""
    headers = {"Authorization": f"Bearer {embedded.api_tokens[who]}"}
    uri = "vaultmail://item/" + ref.replace("#", "/")
    async with session.get(f"{embedded.app_url}/api/v1/resources/read", params={"uri": uri},
                           headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        content: dict[str, Any] = (await resp.json())["content"]
    return content


async def test_a_plan_takes_no_claim_or_parent_from_an_outcome_the_reader_cannot_see(
        embedded: Embedded, person: Any, tools: Any, session: aiohttp.ClientSession) -> None:
    s = await _stage(embedded, person, tools)
    hidden, plan = await _vault_plan_of_hidden(embedded, s, "scout-bot")
    seen = (await _read(embedded, session, LEE, plan))["item"]
    assert not _leaks(seen), seen
    assert (seen["parent"], seen["claim"]) == (None, None)
    sara = (await _read(embedded, session, SARA, plan))["item"]
    assert (sara["parent"], sara["claim"]) == (hidden, "agent:scout")


async def test_an_outcome_does_not_show_waiting_on_whom_a_hidden_plans_question_waits(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """The forge shows the outcome's blockers to whoever reads it (lee): a question on a
    plan lee cannot see does not make it "Waiting on sara"; one on the outcome does."""
    await waiting_by_dependency(embedded)
    s = await _stage(embedded, person, tools)
    plan = await _secret_plan(embedded, s)
    marco = tools(MARCO)
    await marco("add_comment", targetType="plan", target=plan, to=["sara@acme.com"],
                header=f"{WORDS}?", body="Ship it?", needsReply=True)
    assert await blocked_by(s.marco, s.outcome) == []
    await marco("add_comment", targetType="outcome", target=s.outcome, to=["sara@acme.com"],
                body="Prices ready?", needsReply=True)
    assert [t["title"] for t in await blocked_by(s.marco, s.outcome)] == ["Waiting on sara"]


async def test_updates_from_before_a_rename_are_judged_by_the_repository_they_name_now(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """acme/secret renamed acme/hidden, and a new acme/secret lee may read: the updates about
    the old one's plan are still shown to sara (who reads acme/hidden) and not to lee."""
    s = await _stage(embedded, person, tools)
    plan = await _secret_plan(embedded, s)
    await s.marco.call("PATCH", f"/repos/{SECRET}", {"name": "hidden"}, expect=200)
    await embedded.settle()
    embedded.forge.add_repo("acme", "secret")
    embedded.forge.set_permission(SECRET, "lee", "read")
    embedded.services.visibility.forget()
    seen = await tools(LEE)("list_inbox")
    assert not [u for u in seen["updates"] if WORDS in u["summary"]], seen["updates"]
    shown = [u["summary"] for u in (await tools(SARA)("list_inbox"))["updates"]]
    assert f"new plan {plan}: {WORDS}: plan" in shown, shown


async def test_a_comment_on_a_plan_reaches_no_claim_of_an_outcome_its_writer_cannot_see(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """A plan's claim is its hidden outcome's (builder's): lee's `to: agent` is refused as on
    a plan under no outcome, and lee's words reach, mention and name no agent; sara, who may
    read the outcome, reaches builder as before."""
    s = await _stage(embedded, person, tools)
    hidden, plan = await _vault_plan_of_hidden(embedded, s)
    lee = tools(LEE)
    status, body = await lee.raw("add_comment", {"targetType": "plan", "target": plan,
                                                 "to": ["agent"], "body": "Who runs this?"})
    assert status == 422 and "no agent is assigned" in body["error"]["message"], body
    added = await lee("add_comment", targetType="plan", target=plan, body="Looks right")
    assert "builder" not in json.dumps(added), added
    said = [c["body"] for c in await forge_comments(s.marco, plan)]
    assert not [b for b in said if "builder" in b], said
    added = await tools(SARA)("add_comment", targetType="plan", target=plan, to=["agent"],
                              body="Who runs this?")
    assert added["addressed"] == [BUILDER]


async def _inbox_version(embedded: Embedded, session: aiohttp.ClientSession, who: str) -> str:
    """The version sara's console inbox page shows: its live stream sends `change` when the
    version it looks up differs from this."""
    headers = {"Authorization": f"Bearer {embedded.api_tokens[who]}"}
    async with session.get(f"{embedded.app_url}/console/inbox", headers=headers) as resp:
        assert resp.status == 200
        html = await resp.text()
    return html.split('data-version="', 1)[1].split('"', 1)[0]


async def test_a_delivery_on_an_item_its_owner_cannot_see_changes_nothing_of_their_page(
        embedded: Embedded, person: Any, tools: Any, session: aiohttp.ClientSession) -> None:
    """marco addresses builder on an outcome in acme/builds, which builder reads and its
    person sara does not: it lands in sara's agents box, hidden from her; her console page
    (and so its live stream) does not change for it. One on the vault, which she reads, does."""
    embedded.forge.add_repo("acme", "builds")
    embedded.forge.set_permission("acme/builds", "marco", "admin")
    embedded.forge.set_permission("acme/builds", "builder-bot", "write")
    embedded.forge.remove_org_member("acme", "sara")
    marco: Actor = person("marco")
    hidden = await make_item(embedded, marco, "outcome", f"{WORDS}: outcome",
                             repo="acme/builds")
    shown = await make_item(embedded, marco, "outcome", "Public price list")
    before = await _inbox_version(embedded, session, SARA)
    await tools(MARCO)("add_comment", targetType="outcome", target=hidden,
                       to=["agent:builder"], body="Please build it")
    assert await _inbox_version(embedded, session, SARA) == before
    await tools(MARCO)("add_comment", targetType="outcome", target=shown,
                       to=["agent:builder"], body="Please price it")
    assert await _inbox_version(embedded, session, SARA) != before


async def test_the_forge_names_no_claim_holder_of_an_outcome_in_another_repository(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """marco may read the private outcome, so his comment on its plan in the vault reaches
    builder, its claim holder; but the app's comment on the plan is read by everyone who reads
    the vault (lee), so it does not @mention builder: a mention would tell them who holds the
    hidden outcome. One that names builder itself mentions it; on a plan in the outcome's own
    repository, which has exactly the outcome's readers, the claim holder is mentioned."""
    s = await _stage(embedded, person, tools)
    hidden, plan = await _vault_plan_of_hidden(embedded, s)
    marco = tools(MARCO)
    added = await marco("add_comment", targetType="plan", target=plan, body="Looks right")
    assert BUILDER in [r["principal"] for r in added["notify"]], added  # reached, in the index
    added = await marco("add_comment", targetType="plan", target=plan, to=["agent"],
                        body="Who runs this?")
    assert added["addressed"] == [BUILDER], added
    said = [c["body"] for c in await forge_comments(s.marco, plan)]
    assert len(said) == 2 and not [b for b in said if "builder" in b], said
    await marco("add_comment", targetType="plan", target=plan, to=["agent:builder"],
                body="builder, run it")
    said = [c["body"] for c in await forge_comments(s.marco, plan)]
    assert "@builder-bot" in said[-1], said
    inside = await make_item(embedded, s.marco, "plan", f"{WORDS}: plan",
                             body=f"Part of {hidden}", repo=SECRET)
    await marco("add_comment", targetType="plan", target=inside, body="Looks right")
    said = [c["body"] for c in await forge_comments(s.marco, inside)]
    assert "@builder-bot" in said[-1], said


async def test_a_question_card_names_no_claim_holder_of_an_outcome_in_another_repository(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """marco asks `agent` (builder, who holds the private outcome) on its plan in the vault:
    the card, posted and rewritten with builder's answer, is read by everyone who reads the
    vault (lee), so it names no builder; asked as `agent:builder`, it mentions them."""
    s = await _stage(embedded, person, tools)
    hidden, plan = await _vault_plan_of_hidden(embedded, s)
    marco = tools(MARCO)
    added = await marco("add_comment", targetType="plan", target=plan, to=["agent"],
                        needsReply=True, body="Who runs this?")
    assert added["thread"]["askedTo"] == [BUILDER], added
    said = [c["body"] for c in await forge_comments(s.marco, plan)]
    assert len(said) == 1 and "builder" not in said[0], said
    await tools(BUILDER)("add_comment", targetType="plan", target=plan,
                         parent=added["comment"]["id"], body="I do")
    said = [c["body"] for c in await forge_comments(s.marco, plan)]
    assert "**Answered** by agent: I do" in said[0] and "builder" not in said[0], said
    await marco("add_comment", targetType="plan", target=plan, to=["agent:builder"],
                needsReply=True, body="builder, will you run it?")
    said = [c["body"] for c in await forge_comments(s.marco, plan)]
    assert "for @builder-bot" in said[-1], said


async def test_a_question_card_asking_a_person_and_a_hidden_claim_holder_names_the_person(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """marco asks sara and `agent` (builder, who holds the private outcome) on its plan in
    the vault: the card asks "@sara, agent", as marco wrote it, and names no builder; one
    asking only builder, "agent", rewritten with builder's answer and its deletion too. A
    rebuild from the forge reads "agent" back as builder, asked and waited on."""
    s = await _stage(embedded, person, tools)
    hidden, plan = await _vault_plan_of_hidden(embedded, s)
    marco = tools(MARCO)
    added = await marco("add_comment", targetType="plan", target=plan,
                        to=["sara@acme.com", "agent"], needsReply=True, body="Who runs this?")
    assert added["thread"]["askedTo"] == [SARA, BUILDER], added
    said = [c["body"] for c in await forge_comments(s.marco, plan)]
    assert said[-1].splitlines()[1] == "❓ **Question** from **marco** for @sara, agent", said
    alone = await marco("add_comment", targetType="plan", target=plan, to=["agent"],
                        needsReply=True, body="Will you run it?")
    await tools(BUILDER)("add_comment", targetType="plan", target=plan,
                         parent=alone["comment"]["id"], body="I do")
    card = [c["body"] for c in await forge_comments(s.marco, plan)
            if alone["comment"]["id"] in c["body"]][0]
    assert card.splitlines()[1] == "❓ **Question** from **marco** for agent", card
    assert "**Answered** by agent: I do" in card, card
    # builder's answer deleted on the forge: the card waits again, on "agent"
    [answer] = [c for c in await forge_comments(s.marco, plan) if "I do" in c["body"]
                and "kind=question" not in c["body"]]
    await s.marco.call("DELETE", f"/repos/{where(plan)[0]}/issues/comments/{answer['id']}",
                       expect=204)
    await embedded.settle()
    card = [c["body"] for c in await forge_comments(s.marco, plan)
            if alone["comment"]["id"] in c["body"]][0]
    assert "Answer withdrawn" in card and "Waiting on agent again" in card, card
    assert "builder" not in card, card
    # a rebuild from the forge: both questions ask builder, the second waits on him again
    await _drop_work(embedded)
    await _reindex(embedded)
    both = await db.get_thread(embedded.services.store, added["comment"]["id"])
    assert both is not None and list(both.state.asked) == [SARA, BUILDER], both
    again = await db.get_thread(embedded.services.store, alone["comment"]["id"])
    assert again is not None and list(again.state.asked) == [BUILDER], again
    assert list(again.state.waiting_on) == [BUILDER], again


async def test_the_note_for_a_hand_comment_names_no_claim_holder_of_a_hidden_outcome(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """marco writes `to: agent` by hand on the vault plan of the private outcome: it reaches
    builder, but the app's note that would mention builder is read by the vault's readers,
    so none is posted; `to: agent:builder`, named by marco, gets it."""
    s = await _stage(embedded, person, tools)
    hidden, plan = await _vault_plan_of_hidden(embedded, s)
    await s.marco.comment(*where(plan), "to: agent\n\nWho runs this?")
    await embedded.settle()
    said = [c["body"] for c in await forge_comments(s.marco, plan)]
    assert len(said) == 1 and not [b for b in said if "builder" in b], said
    await s.marco.comment(*where(plan), "to: agent:builder\n\nbuilder, run it")
    await embedded.settle()
    said = [c["body"] for c in await forge_comments(s.marco, plan)]
    assert "@builder-bot" in said[-1], said


async def test_a_thread_on_a_plan_names_no_hidden_claim_holder_to_a_reader_who_cannot_see_it(
        embedded: Embedded, person: Any, tools: Any, session: aiohttp.ClientSession) -> None:
    """marco asks lee and `agent` (builder, who holds the private outcome) on its plan in the
    vault. The plan's resource gives lee no claim (item_view) and the card names no builder;
    its threads named builder as asked, waited on and answering. Now lee is told of them as
    the card tells him (asked of lee; answered by "agent"); sara, who may see the outcome,
    of builder."""
    s = await _stage(embedded, person, tools)
    hidden, plan = await _vault_plan_of_hidden(embedded, s)
    asked = await tools(MARCO)("add_comment", targetType="plan", target=plan,
                               to=["lee@acme.com", "agent"], needsReply=True,
                               body="Who runs this?")
    [thread] = (await _read(embedded, session, LEE, plan))["threads"]
    assert (thread["askedTo"], thread["waitingOn"]) == ([LEE], [LEE]), thread
    [thread] = (await _read(embedded, session, SARA, plan))["threads"]
    assert (thread["askedTo"], thread["waitingOn"]) == ([LEE, BUILDER], [LEE, BUILDER])
    await tools(BUILDER)("add_comment", targetType="plan", target=plan,
                         parent=asked["comment"]["id"], body="I do")
    [thread] = (await _read(embedded, session, LEE, plan))["threads"]
    assert thread["answer"]["by"] == "agent" and "builder" not in json.dumps(thread), thread
    [thread] = (await _read(embedded, session, SARA, plan))["threads"]
    assert thread["answer"]["by"] == BUILDER, thread


async def test_lees_inbox_and_his_answer_name_no_hidden_claim_holder(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """The same question, in lee's inbox (Your turn) and in what his answer returns (the
    thread, whom it reached): asked of builder, waiting on builder, reaching builder were
    given him there too."""
    s = await _stage(embedded, person, tools)
    hidden, plan = await _vault_plan_of_hidden(embedded, s)
    asked = await tools(MARCO)("add_comment", targetType="plan", target=plan,
                               to=["lee@acme.com", "agent"], needsReply=True,
                               body="Who runs this?")
    lee = tools(LEE)
    [card] = (await lee("list_inbox"))["you"]["yourTurn"]
    assert (card["askedTo"], card["waitingOn"]) == ([LEE], [LEE]), card
    answered = await lee("add_comment", targetType="plan", target=plan,
                         parent=asked["comment"]["id"], body="sara does")
    assert answered["thread"]["askedTo"] == [LEE], answered
    assert "builder" not in json.dumps(answered), answered
    resolved = await tools(MARCO)("resolve_comment", comment=asked["comment"]["id"])
    assert resolved["thread"]["askedTo"] == [LEE, BUILDER], resolved



async def test_a_note_to_one_not_asked_names_no_hidden_claim_holder_as_asked(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """marco asks sara and `agent` (builder, holding the private outcome) on its plan in the
    vault; lee, not asked, writes `/answer` naming it by hand, and ticks its card. The notes
    that tell him his words are a reply and his tick is undone, read by everyone who reads
    the vault, said the question "asks human:sara@acme.com, agent:builder": now whom the card
    names (sara)."""
    s = await _stage(embedded, person, tools)
    hidden, plan = await _vault_plan_of_hidden(embedded, s)
    asked = await tools(MARCO)("add_comment", targetType="plan", target=plan,
                               to=["sara@acme.com", "agent"], needsReply=True,
                               body="Run it today?", options=[{"label": "Yes"}, {"label": "No"}])
    lee = person("lee")
    await lee.comment(*where(plan), f"/answer {asked['comment']['id']} sara does")
    [card] = [c for c in await forge_comments(s.marco, plan) if "kind=question" in c["body"]]
    await lee.call("PATCH", f"/repos/{where(plan)[0]}/issues/comments/{card['id']}",
                   {"body": card["body"].replace("- [ ] 1.", "- [x] 1.")}, expect=200)
    await embedded.settle()
    said = [c["body"] for c in await forge_comments(s.marco, plan)]
    [note] = [b for b in said if "not the answer" in b]
    assert "asks human:sara@acme.com, and only they answer it" in note, note
    [note] = [b for b in said if "undone" in b]
    assert "only the people it asks (human:sara@acme.com) can tick" in note, note
    assert not [b for b in said if "builder" in b], said


async def test_a_hidden_claim_holders_answer_is_posted_and_shown_by_agent(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """marco asks lee and `agent` (builder, holding the private outcome) on its plan in the
    vault; builder answers. The card said "Answered by agent", but the app posted builder's
    answer as "💬 **agent:builder**", read by lee (as by everyone who reads the vault), and
    lee's inbox gave it him with `author: agent:builder`. Now both say "agent", as the card
    does; marco, who may see the outcome, is shown builder; asked as `agent:builder`, the
    forge names them."""
    s = await _stage(embedded, person, tools)
    hidden, plan = await _vault_plan_of_hidden(embedded, s)
    marco, builder = tools(MARCO), tools(BUILDER)
    asked = await marco("add_comment", targetType="plan", target=plan,
                        to=["lee@acme.com", "agent"], needsReply=True, body="Who runs this?")
    answered = await builder("add_comment", targetType="plan", target=plan,
                             parent=asked["comment"]["id"], body="I do")
    said = [c["body"] for c in await forge_comments(person("lee"), plan)]
    assert not [b for b in said if "builder" in b], said
    assert f"💬 **agent** replied in thread `{asked['comment']['id']}`" in said[-1], said
    [answer] = [c for c in (await tools(LEE)("list_inbox"))["you"]["unread"]
                if c["body"] == "I do"]
    assert answer["author"] == "agent", answer
    [answer] = [c for c in (await marco("list_inbox"))["you"]["unread"]
                if c["body"] == "I do"]
    assert answer["author"] == BUILDER, answer
    named = await marco("add_comment", targetType="plan", target=plan,
                        to=["agent:builder"], needsReply=True, body="Today?")
    await builder("add_comment", targetType="plan", target=plan,
                  parent=named["comment"]["id"], body="Yes")
    said = [c["body"] for c in await forge_comments(person("lee"), plan)]
    assert "💬 **agent:builder** replied in thread" in said[-1], said
    # builder's own question (its card) and comment on the plan: by "agent" too
    embedded.forge.set_permission("acme/scout-vault", "builder-bot", "write")
    embedded.services.visibility.forget()
    own = await builder("add_comment", targetType="plan", target=plan, to=["lee@acme.com"],
                        needsReply=True, body="Shall I start?")
    await builder("add_comment", targetType="plan", target=plan, body="Started")
    said = [c["body"] for c in await forge_comments(person("lee"), plan)]
    assert said[-2].splitlines()[1].startswith("❓ **Question** from **agent** for @lee"), said
    assert said[-1].splitlines()[1].startswith("💬 **agent**"), said
    # a rebuild from the forge takes "agent" for the claim holder it stands for
    await _drop_work(embedded)
    await _reindex(embedded)
    rebuilt = await db.get_comment(embedded.services.store, answered["comment"]["id"])
    assert rebuilt is not None and rebuilt.author == BUILDER, rebuilt
    thread = await db.get_thread(embedded.services.store, own["comment"]["id"])
    assert thread is not None and thread.state.asker == BUILDER, thread


BUILDER_BLOCK = ("  - slug: builder\n    login: builder-bot\n    person: sara@acme.com\n"
                 "    run:\n      triggers: [mail]\n      dispatch: none\n    capabilities:\n"
                 "      mail.send: [scout]\n")


async def test_a_hidden_claim_holder_who_left_is_not_named_as_having_left(
        embedded: Embedded, person: Any, tools: Any, session: aiohttp.ClientSession) -> None:
    """marco asks lee and `agent` (builder, holding the private outcome) on its plan in the
    vault, and `agent` alone; builder leaves the office. Lee's card in his inbox (`left`,
    `why`), the plan's threads and the cards on the forge said "builder has left the
    office": now they name nobody who left; marco, who may see the outcome, is told."""
    s = await _stage(embedded, person, tools)
    hidden, plan = await _vault_plan_of_hidden(embedded, s)
    marco = tools(MARCO)
    both = await marco("add_comment", targetType="plan", target=plan,
                       to=["lee@acme.com", "agent"], needsReply=True, body="Who runs this?")
    alone = await marco("add_comment", targetType="plan", target=plan, to=["agent"],
                        needsReply=True, body="Will you run it?")
    embedded.forge.put_file("acme/.github", "vaultmail.yml", _without(
        BUILDER_BLOCK, "    builder: {accept: [example.org], otherwise: hold}\n"),
        pusher="admin")
    await embedded.settle()
    [card] = (await tools(LEE)("list_inbox"))["you"]["yourTurn"]
    assert card["thread"] == both["comment"]["id"] and "builder" not in json.dumps(card), card
    assert "left" not in card and "why" not in card, card
    threads = (await _read(embedded, session, LEE, plan))["threads"]
    assert len(threads) == 2 and "builder" not in json.dumps(threads), threads
    said = [c["body"] for c in await forge_comments(person("lee"), plan)]
    assert not [b for b in said if "builder" in b], said
    [back] = [t for t in (await _read(embedded, session, MARCO, plan))["threads"]
              if t["thread"] == alone["comment"]["id"]]
    assert back["left"] == ["builder"] and "builder has left the office" in back["why"], back
    [back] = [t for t in threads if t["thread"] == alone["comment"]["id"]]
    assert back["left"] == [] and back["why"].startswith("Nobody is asked now"), back


async def test_the_ledger_shows_no_reader_entries_naming_a_hidden_claim_holder(
        embedded: Embedded, person: Any, tools: Any, session: aiohttp.ClientSession) -> None:
    """marco asks `agent` (builder, holding the private outcome) on its plan in the vault and
    builder answers. The ledger's entries about the plan, which lee may read (list_changes,
    the console's ledger), named builder as reached, asked, answering and writing. Now an
    entry on the plan that names the claim holder lee may not know is not shown him, as an
    entry about the outcome is not; the others about the plan are; sara is shown them all."""
    s = await _stage(embedded, person, tools)
    hidden, plan = await _vault_plan_of_hidden(embedded, s)
    asked = await tools(MARCO)("add_comment", targetType="plan", target=plan, to=["agent"],
                               needsReply=True, body="Who runs this?")
    await tools(BUILDER)("add_comment", targetType="plan", target=plan,
                         parent=asked["comment"]["id"], body="I do")
    await tools(LEE)("add_comment", targetType="plan", target=plan, body="Looks right")

    async def about_plan(who: str) -> list[dict[str, Any]]:
        events = (await tools(who)("list_changes", since=0, limit=1000))["events"]
        return [e for e in events if e["subject"] == plan]

    seen = await about_plan(LEE)
    assert not [e for e in seen if "builder" in json.dumps(e)], seen
    assert [e["actor"] for e in seen if e["event"] == "comment.added"] == [LEE], seen
    assert [e for e in await about_plan(SARA) if e["actor"] == BUILDER]
    headers = {"Authorization": f"Bearer {embedded.api_tokens[LEE]}"}
    async with session.get(f"{embedded.app_url}/console/ledger", headers=headers) as resp:
        assert resp.status == 200
        rows = (await resp.text()).split("<table", 1)[1]  # (its filter lists every agent)
    assert "agent:builder" not in rows and "human:lee@acme.com" in rows, rows


async def test_an_entry_naming_a_plan_in_another_case_names_no_hidden_claim_holder(
        embedded: Embedded, person: Any, tools: Any, session: aiohttp.ClientSession) -> None:
    """A ledger subject is a ref as written, and a ref typed by hand may be in any case
    (`Acme/Scout-Vault#3`: the forge ignores case). The item it names was looked up under the
    subject's own spelling, where items are kept under the canonical (lower-cased) ref
    (`make_ref`): no item was found, so an entry on the plan naming builder, the claim holder
    of an outcome lee may not see, was shown him. No tool writes such a subject today (each
    writes `item.ref`), so it is written as one would be."""
    s = await _stage(embedded, person, tools)
    _, plan = await _vault_plan_of_hidden(embedded, s)
    repo, n = where(plan)
    typed = "/".join(part.title() for part in repo.split("/")) + f"#{n}"
    assert typed != plan and typed.lower() == plan
    store = embedded.services.store
    await ledger.record(store, "comment.added", BUILDER, typed, {"words": 2}, org="acme")
    await ledger.record(store, "comment.added", "agent:scout", typed, {"asked": [BUILDER]},
                        org="acme")
    await ledger.record(store, "comment.added", LEE, typed, {"words": 3}, org="acme")

    async def about_plan(who: str) -> list[dict[str, Any]]:
        events = (await tools(who)("list_changes", since=0, limit=1000))["events"]
        return [e for e in events if e["subject"] == typed]

    seen = await about_plan(LEE)
    assert not [e for e in seen if "builder" in json.dumps(e)], seen
    assert [e["actor"] for e in seen] == [LEE], seen
    assert len(await about_plan(SARA)) == 3
    headers = {"Authorization": f"Bearer {embedded.api_tokens[LEE]}"}
    async with session.get(f"{embedded.app_url}/console/ledger", headers=headers) as resp:
        assert resp.status == 200
        rows = (await resp.text()).split("<table", 1)[1]  # (its filter lists every agent)
    assert "agent:builder" not in rows and "human:lee@acme.com" in rows, rows
