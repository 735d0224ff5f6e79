"""`vaultmail reindex` rebuilds the mail index from the forge alone."""

from __future__ import annotations

from typing import Any

from bot.app.embedded import Embedded
from bot.email.keys import comment_key
from bot.mail.reindex import reindex
from bot.store import mails
from tests.test_tamper import vaultmail


async def _busy_office(embedded: Embedded, tools: Any, person: Any) -> None:
    marco, scout, builder = (tools("human:marco@acme.com"), tools("agent:scout"),
                             tools("agent:builder"))
    await person("sara").open_issue("acme/scout-vault", "Hand-made", "From the forge")
    first = (await marco("mail_send", to="scout", subject="One", body="first"))["mail"]
    await scout("mail_open", mail=first["ref"])
    ping = (await builder("mail_send", to="scout", subject="Ping", body="ping"))["mail"]
    await scout("mail_reply", mail=ping["ref"], body="pong")
    await marco("mail_close", mail=first["ref"])
    await embedded.settle()


async def test_reindex_rebuilds_an_index_equal_to_the_live_one(
        embedded: Embedded, tools: Any, person: Any) -> None:
    await _busy_office(embedded, tools, person)
    store = embedded.services.store
    live = await mails.all_mails(store)
    assert len(live) == 4
    await mails.replace_all(store, [])
    forge = embedded.services.forge_for(None)
    report = await reindex(store, forge, embedded.office, embedded.services.keyring,
                           app_login=embedded.services.bot_login, comment_key=_key(embedded))
    assert report.mails == 4 and report.tampered == []
    assert await mails.all_mails(store) == live


LIST = "GET /repos/{owner}/{repo}/issues"


async def _office_repos(embedded: Embedded) -> list[str]:
    """The repositories a reindex lists, each once: the vaults for mail, and every other
    repository of the office for its items (bot.items.rebuild)."""
    repos = await embedded.services.forge_for(None).list_installation_repos()
    return [r for r in repos if r.lower().startswith("acme/")]


async def test_a_second_reindex_under_the_same_token_costs_no_rate_limit(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """Rereads are free only while the installation token is the same: GitHub's ETags hash the
    Authorization header with the body (as the local forge's do), so the ETag cache pays off
    within one token's hour."""
    await _busy_office(embedded, tools, person)
    store, forge = embedded.services.store, embedded.services.forge_for(None)
    args = (store, forge, embedded.office, embedded.services.keyring)
    app_login = embedded.services.bot_login
    await reindex(*args, app_login=app_login, comment_key=_key(embedded))
    before = len(embedded.forge.requests.records)
    report = await reindex(*args, app_login=app_login, comment_key=_key(embedded))
    assert report.mails == 4
    lists = [r for r in embedded.forge.requests.records[before:] if r.route == LIST]
    assert len(lists) == len(await _office_repos(embedded))
    assert all(r.status == 304 for r in lists)


async def test_after_the_tokens_hour_a_reindex_reads_everything_again(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """An installation token lives an hour (on the forge clock); the next one gets new ETags
    for the same content, so the first reread after it costs a request per page again."""
    await _busy_office(embedded, tools, person)
    store, forge = embedded.services.store, embedded.services.forge_for(None)
    args = (store, forge, embedded.office, embedded.services.keyring)
    app_login = embedded.services.bot_login
    await reindex(*args, app_login=app_login, comment_key=_key(embedded))
    embedded.forge.clock.advance(3601)
    before = len(embedded.forge.requests.records)
    report = await reindex(*args, app_login=app_login, comment_key=_key(embedded))
    assert report.mails == 4
    lists = [r for r in embedded.forge.requests.records[before:]
             if r.route == LIST and r.status != 401]
    assert len(lists) == len(await _office_repos(embedded))
    assert all(r.status == 200 for r in lists)


async def test_a_second_reindex_command_mints_its_own_token_and_reads_in_full(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """Each `vaultmail reindex` is a new process with a new installation token, so the ETags
    saved in etag-cache.json by the last run do not match (a 200 per page, not a 304). What
    the README says of a second run, held to the forge that models GitHub's ETags."""
    await _busy_office(embedded, tools, person)
    code, out = await vaultmail(embedded, "reindex")
    assert code == 0 and "reindexed 4 mail(s)" in out, out
    before = len(embedded.forge.requests.records)
    code, out = await vaultmail(embedded, "reindex")
    assert code == 0 and "reindexed 4 mail(s)" in out, out
    lists = [r for r in embedded.forge.requests.records[before:] if r.route == LIST]
    assert len(lists) == len(await _office_repos(embedded))
    assert all(r.status == 200 for r in lists)


# -- the work graph: items, comments, questions, answers, decisions, inboxes -----------------
PEOPLE = ["human:marco@acme.com", "human:sara@acme.com", "agent:scout", "agent:builder"]
# what moves by itself (times, cursors), and an option's `then`: the asker's own note, kept in
# the index alone and never on the forge, so no rebuild has it (docs/using.md, "Reindex")
_MOVING = {"at", "since", "cursor", "waitedMs", "checkedAt", "now", "note", "edited", "then"}


def _still(x: Any) -> Any:
    """A snapshot without what moves by itself, or what the forge never holds."""
    if isinstance(x, dict):
        return {k: _still(v) for k, v in x.items() if k not in _MOVING}
    if isinstance(x, list):
        return [_still(v) for v in x]
    return x


async def _work(embedded: Embedded, tools: Any, person: Any) -> tuple[str, str, str]:
    """Review r2's walk: a question answered, a comment to someone, a question still waiting."""
    from tests.items_support import TOKEN_TTL, make_item

    marco, scout = tools("human:marco@acme.com"), tools("agent:scout")
    goal = await make_item(embedded, person("marco"), "goal", "Safer sign-in")
    outcome = await make_item(embedded, person("marco"), "outcome", "Auth migration",
                              body=f"Part of {goal}")
    plan = await make_item(embedded, person("marco"), "plan", "Dual read",
                           body=f"Part of {outcome}")
    asked = await scout("add_comment", target=outcome, **TOKEN_TTL)
    await embedded.settle()
    await marco("add_comment", target=outcome, targetType="outcome",
                parent=asked["comment"]["id"], option="Keep 30 days", body="keep them")
    await scout("add_comment", target=plan, targetType="plan", to=["sara@acme.com"],
                body="FYI the plan")
    waiting = await scout("add_comment", target=outcome, targetType="outcome",
                          to=["sara@acme.com"], body="Which region?", needsReply=True)
    await embedded.settle()
    return goal, outcome, waiting["comment"]["id"]


async def _snapshot(embedded: Embedded, tools: Any, goal: str,
                    outcome: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for who in PEOPLE:
        t = tools(who)
        out[who] = {"inbox": _still(await t("list_inbox", markRead=False)),
                    "outcome": _still(await t("get_outcome", outcome=outcome)),
                    "tree": _still(await t("get_tree", goal=goal))}
    return out


async def _reindex(embedded: Embedded) -> Any:
    services = embedded.services
    return await reindex(services.store, services.forge_for(None), embedded.office,
                         services.keyring, app_login=services.bot_login,
                         comment_key=_key(embedded))


def _key(embedded: Embedded) -> bytes:
    return comment_key(embedded.services.settings.data_dir, embedded.office.org)


async def _drop_work(embedded: Embedded) -> None:
    async with embedded.services.store.transaction() as tx:
        for table in ("items", "comments", "threads", "inbox_deliveries", "inbox_agent_marks"):
            await tx.execute(f"DELETE FROM {table}")


async def test_reindex_rebuilds_the_work_graph_each_person_and_agent_sees(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """Review r2: after the index was lost and rebuilt, sara's waiting question, marco's answer
    in scout's turn and the outcome's decision were gone. Each reader's inbox, outcome and tree
    read the same after a reindex (times aside, and read marks: a rebuild's deliveries are read),
    and a second reindex adds nothing."""
    goal, outcome, _ = await _work(embedded, tools, person)
    for who in PEOPLE:  # read marks aside: everything shown once before the loss
        await tools(who)("list_inbox")
    before = await _snapshot(embedded, tools, goal, outcome)
    assert before["human:marco@acme.com"]["outcome"]["decisions"]
    await _drop_work(embedded)
    args = (embedded.services.store, embedded.services.forge_for(None), embedded.office,
            embedded.services.keyring)
    await reindex(*args, app_login=embedded.services.bot_login,
                          comment_key=_key(embedded))
    after = await _snapshot(embedded, tools, goal, outcome)
    for who in PEOPLE:
        assert after[who] == before[who], who
    again = await reindex(*args, app_login=embedded.services.bot_login,
                          comment_key=_key(embedded))
    assert again.work is not None and (again.work.comments, again.work.questions) == (0, 0)
    assert await _snapshot(embedded, tools, goal, outcome) == after


async def test_a_forge_answer_after_a_reindex_is_taken(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """Review r2: sara's `/answer EU please` after the rebuild was refused ("no open question
    on … asks human:sara") with the question's card right above it."""
    _, outcome, question = await _work(embedded, tools, person)
    await _drop_work(embedded)
    await _reindex(embedded)
    repo, _, number = outcome.partition("#")
    await person("sara").comment(repo, int(number), "/answer EU please")
    await embedded.forge.webhooks_idle()
    await embedded.settle()
    got = await tools("agent:scout")("get_outcome", outcome=outcome)
    assert {(d["thread"], d["answer"]["body"]) for d in got["decisions"]} >= {
        (question, "EU please")}, got


async def test_answers_given_on_the_forge_are_rebuilt_a_typed_one_and_a_tick(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """What people did on the forge alone is read back from it: sara's `/answer` comment, and
    marco's tick on the card (no comment of its own: the card shows it), and scout resolving
    it (the card says so). A tick's comment, which the forge never had, came back under an
    id of its own, made from the card and the tick: the card's mark names the comment each
    answer came from, a tick's too, and a rebuild gives it that id (docs/using.md)."""
    from bot.store import comments as db
    from tests.items_support import TOKEN_TTL, forge_comments

    goal, outcome, waiting = await _work(embedded, tools, person)
    repo, _, number = outcome.partition("#")
    await person("sara").comment(repo, int(number), "/answer EU please")
    asked = await tools("agent:scout")("add_comment", target=outcome,
                                       **{**TOKEN_TTL, "header": "Cache TTL"})
    await embedded.forge.webhooks_idle()
    await embedded.settle()
    marco = person("marco")
    card = next(c for c in await forge_comments(marco, outcome)
                if f"id={asked['comment']['id']} kind=question" in c["body"])
    ticked = card["body"].replace("- [ ] 2.", "- [x] 2.", 1)
    await marco.call("PATCH", f"/repos/{repo}/issues/comments/{card['id']}", {"body": ticked},
                     expect=200)
    await embedded.forge.webhooks_idle()
    await embedded.settle()
    await tools("agent:scout")("resolve_comment", comment=asked["comment"]["id"])
    for who in PEOPLE:
        await tools(who)("list_inbox")
    before = _still(await _snapshot(embedded, tools, goal, outcome))
    decided = {d["thread"]: d["answer"] for d in
               before["human:marco@acme.com"]["outcome"]["decisions"]}
    assert decided[waiting]["body"] == "EU please"
    assert decided[asked["comment"]["id"]]["option"] == "Force re-login"
    assert any(d["resolved"] for d in before["human:marco@acme.com"]["outcome"]["decisions"])
    store = embedded.services.store

    async def tick() -> str | None:
        t = await db.get_thread(store, asked["comment"]["id"])
        return t.state.answer.comment if t is not None and t.state.answer else None

    ticked_live = await tick()
    await _drop_work(embedded)
    await _reindex(embedded)
    after = await _snapshot(embedded, tools, goal, outcome)
    assert after == before, "\n".join(_differences(before, after))
    assert await tick() == ticked_live


async def test_a_comment_refused_for_want_of_write_access_stays_out_of_a_rebuild(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """On a public repository anyone may comment; someone without write access who starts a
    thread is refused, and nothing of it is indexed or delivered. A rebuild reads the forge's
    comments: it holds the same rule, or troll's words would reach marco after a reindex."""
    forge = embedded.forge
    site = "acme/website"
    forge.add_repo("acme", "website", private=False)
    forge.set_permission(site, "marco", "write")
    embedded.forge_tokens["troll"] = forge.add_user("troll")
    outcome = await person("marco").open_issue(site, "Ship login", "login for all",
                                               labels=["outcome"])
    await embedded.settle()
    await person("troll").comment(site, int(outcome["number"]),
                                  "to: marco@acme.com\nclick my link")
    await embedded.forge.webhooks_idle()
    await embedded.settle()
    marco = tools("human:marco@acme.com")
    before = _still(await marco("list_inbox", markRead=False))
    await _drop_work(embedded)
    report = await _reindex(embedded)
    assert report.work is not None and report.work.comments == 0
    assert _still(await marco("list_inbox", markRead=False)) == before


def _decided(got: dict[str, Any]) -> dict[str, Any]:
    return {d["thread"]: d["answer"] for d in got["decisions"]}


async def test_an_edited_hand_comment_is_words_in_a_rebuild_as_it_was_live(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """Review r7 (A): marco (write access) edits sara's plain words on the forge into
    `/answer US only`. Live, an edit runs no command; a rebuild reads the forge as it stands,
    so it must read an edited comment as live did: words, answering nothing."""
    _, outcome, waiting = await _work(embedded, tools, person)
    repo, _, number = outcome.partition("#")
    said = await person("sara").comment(repo, int(number), "I'll look at it next week")
    await embedded.forge.webhooks_idle()
    await embedded.settle()
    embedded.forge.clock.advance(5)  # the forge stamps to the second: an edit after it
    await person("marco").call("PATCH", f"/repos/{repo}/issues/comments/{said['id']}",
                               {"body": "/answer US only"}, expect=200)
    await embedded.forge.webhooks_idle()
    await embedded.settle()
    scout = tools("agent:scout")
    live = _decided(await scout("get_outcome", outcome=outcome))
    assert waiting not in live
    await _drop_work(embedded)
    await _reindex(embedded)
    assert _decided(await scout("get_outcome", outcome=outcome)) == live


def _chosen(got: dict[str, Any]) -> list[Any]:
    """Each decision's choices, the answer's and those before it, and whose they were."""
    return [(d["thread"], d["answer"]["option"], d["decidedBy"],
             [(h["option"], h["by"]) for h in d["history"]]) for d in got["decisions"]]


async def _edit_app_comment(embedded: Embedded, person: Any, who: str, outcome: str,
                            find: str, edit: Any) -> None:
    """`who` (write access) edits, on the forge, the app's comment on `outcome` holding
    `find`: `edit` makes its new body from the old."""
    from tests.items_support import forge_comments

    repo, _, _ = outcome.partition("#")
    them = person(who)
    mine = next(c for c in await forge_comments(them, outcome) if find in c["body"])
    await them.call("PATCH", f"/repos/{repo}/issues/comments/{mine['id']}",
                    {"body": edit(mine["body"])}, expect=200)
    await embedded.forge.webhooks_idle()
    await embedded.settle()


async def test_the_apps_comment_rewritten_on_the_forge_is_no_ones_answer_in_a_rebuild(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """Review r7 (C2): marco edits the app's comment of his own words to read
    '💬 **sara** replied in thread <Which region?>' and 'EU only, final.'. Live, the app's
    comments are its own words and an edit changes nothing; a rebuild took the head as the
    forge shows it: sara had answered. The app's comment is sealed (a keyed MAC over what it
    wrote): one a person edited is left out of a rebuild, and the report says so."""
    _, outcome, waiting = await _work(embedded, tools, person)
    await tools("human:marco@acme.com")("add_comment", target=outcome, targetType="outcome",
                                        body="Looks fine to me")
    await embedded.settle()

    def forged(body: str) -> str:
        lines = body.split("\n")
        lines[1], lines[3] = f"💬 **sara** replied in thread `{waiting}`", "EU only, final."
        return "\n".join(lines)

    await _edit_app_comment(embedded, person, "marco", outcome, "Looks fine to me", forged)
    scout = tools("agent:scout")
    live = _decided(await scout("get_outcome", outcome=outcome))
    assert waiting not in live
    await _drop_work(embedded)
    report = await _reindex(embedded)
    assert _decided(await scout("get_outcome", outcome=outcome)) == live
    assert report.work is not None and len(report.work.skipped) == 1, report.work


async def test_a_note_edited_on_the_apps_answer_is_no_change_of_answer_in_a_rebuild(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """Review r7 (B): sara (write access, not asked) edits the app's comment carrying marco's
    answer 'Keep 30 days' into '(answer: Force re-login)'. Live nothing changes; a rebuild
    read the note as written now: a change of answer marco never made. The comment is left
    out; the card (the app's, sealed) still says marco answered 'Keep 30 days', which was read
    as his tick: the choice stood, its words went with the comment. The card's mark names the
    comment that gave it, gone from the rebuild: its answer is replayed as the card shows it,
    words and id, and everyone reads what they read live."""
    _, outcome, _ = await _work(embedded, tools, person)
    await _edit_app_comment(
        embedded, person, "sara", outcome, "(answer: Keep 30 days)",
        lambda body: body.replace("(answer: Keep 30 days)", "(answer: Force re-login)"))
    scout = tools("agent:scout")
    live = _chosen(await scout("get_outcome", outcome=outcome))
    seen = await _seen_by(tools, PEOPLE, [outcome])
    await _drop_work(embedded)
    await _reindex(embedded)
    after = _chosen(await scout("get_outcome", outcome=outcome))
    assert after == live
    now = await _seen_by(tools, PEOPLE, [outcome])
    for who in PEOPLE:
        assert now[who] == seen[who], "\n".join([who, *_differences(seen[who], now[who])])


async def test_a_seal_edited_to_any_text_is_a_broken_seal_not_a_failed_rebuild(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """sara (write access) edits the seal of the app's comment to read `v2=é...`: the seal
    was compared as text, which Python's constant-time compare refuses for anything not
    ASCII, so the rebuild of the whole office failed (TypeError) on one person's edit. A
    seal of any text that is not the app's is broken: the comment is left out, as any edited
    one, and the rest is rebuilt."""
    _, outcome, _ = await _work(embedded, tools, person)
    await _edit_app_comment(
        embedded, person, "sara", outcome, "(answer: Keep 30 days)",
        lambda body: body.replace("<!-- vaultmail:seal v2=", "<!-- vaultmail:seal v2=é"))
    scout = tools("agent:scout")
    live = _chosen(await scout("get_outcome", outcome=outcome))
    await _drop_work(embedded)
    report = await _reindex(embedded)
    assert report.work is not None and len(report.work.skipped) == 1, report.work
    assert _chosen(await scout("get_outcome", outcome=outcome)) == live


async def test_a_thread_the_index_has_older_than_the_forge_is_brought_up_to_date(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """Review r7 (F): an index behind the forge (a backup from before sara's `/answer EU
    please`: the question's row as it was then, her answer's comment missing). The rebuild
    added the comment but wrote a thread only where there was none: the decision stayed
    missing, and sara's turn stayed hers, however often it ran."""
    from bot.store import comments as db

    _, outcome, waiting = await _work(embedded, tools, person)
    store = embedded.services.store
    old = await db.get_thread(store, waiting)
    assert old is not None
    repo, _, number = outcome.partition("#")
    await person("sara").comment(repo, int(number), "/answer EU please")
    await embedded.forge.webhooks_idle()
    await embedded.settle()
    scout, sara = tools("agent:scout"), tools("human:sara@acme.com")
    live = _decided(await scout("get_outcome", outcome=outcome))
    turn = _still((await sara("list_inbox", markRead=False))["you"]["yourTurn"])
    assert live[waiting]["body"] == "EU please"
    async with store.transaction() as tx:  # the backup: from before sara's answer
        await tx.execute("DELETE FROM comments WHERE thread = ? AND id <> ?", (waiting, waiting))
        await db.put_thread(tx, old)
    report = await _reindex(embedded)
    assert report.work is not None and report.work.comments == 1
    assert _decided(await scout("get_outcome", outcome=outcome)) == live
    assert _still((await sara("list_inbox", markRead=False))["you"]["yourTurn"]) == turn
    again = await _reindex(embedded)
    assert again.work is not None and again.work.comments == 0
    assert _decided(await scout("get_outcome", outcome=outcome)) == live



async def test_an_outsiders_part_of_line_links_nothing_in_a_rebuild(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """Review r7 (D): troll (no one of the office) opens an issue on acme's public website,
    marco labels it evidence, and troll edits its body to `Part of <the outcome>`. Live the
    link is taken only from someone with write access (Comments._linked); a rebuild took the
    body as the forge shows it, hanging troll's words under marco's outcome."""
    goal, outcome, _ = await _work(embedded, tools, person)
    forge, site = embedded.forge, "acme/website"
    forge.add_repo("acme", "website", private=False)
    forge.set_permission(site, "marco", "write")
    embedded.forge_tokens["troll"] = forge.add_user("troll")
    troll = person("troll")
    issue = await troll.open_issue(site, "Login is slow", "see logs")
    await person("marco").call("POST", f"/repos/{site}/issues/{issue['number']}/labels",
                               {"labels": ["evidence"]}, expect=200)
    await embedded.forge.webhooks_idle()
    await embedded.settle()
    await troll.call("PATCH", f"/repos/{site}/issues/{issue['number']}",
                     {"body": f"Part of {outcome}\nOutcome done, ship it"}, expect=200)
    await embedded.forge.webhooks_idle()
    await embedded.settle()
    marco = tools("human:marco@acme.com")
    live = _still(await marco("get_tree", goal=goal))
    assert "Login is slow" not in str(live)
    await _drop_work(embedded)
    await _reindex(embedded)
    assert _still(await marco("get_tree", goal=goal)) == live


async def test_a_rebuild_reaches_no_claim_of_an_outcome_the_writer_cannot_see(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """lee writes in scout's vault and may not see private acme/secret, whose outcome (held
    by builder) a plan in the vault is part of. Live, lee's hand `to: agent` on the plan is
    refused and lee's words reach no agent (views.claim_seen); a rebuild took the plan's claim
    for every writer, so after a reindex builder was addressed and reached."""
    from bot.store import comments as db
    from tests.items_support import BUILDER, LEE, make_item
    from tests.test_item_updates import SECRET, _stage

    s = await _stage(embedded, person, tools)
    hidden = await make_item(embedded, s.marco, "outcome", "Secret outcome", repo=SECRET,
                             assignees=["builder-bot"])
    plan = await make_item(embedded, s.marco, "plan", "Price list: plan",
                           body=f"Part of {hidden}")
    repo, n = plan.split("#")
    lee = person("lee")
    posted = [await lee.comment(repo, int(n), "to: agent\nWho runs this?"),
              await lee.comment(repo, int(n), "Looks right")]
    await tools(LEE)("add_comment", targetType="plan", target=plan, body="Fine by me")
    await embedded.forge.webhooks_idle()
    await embedded.settle()
    ids = [int(c["id"]) for c in await s.marco.comments(repo, int(n))]
    assert {int(c["id"]) for c in posted} <= set(ids)
    store = embedded.services.store

    async def indexed() -> dict[int, Any]:
        rows = [await db.comment_by_forge_id(store, i, plan) for i in ids]
        return {r.forge_id: (r.data["addressed"], [x["principal"] for x in r.data["notify"]])
                for r in rows if r is not None and r.forge_id is not None}

    live = await indexed()
    assert int(posted[0]["id"]) not in live and len(live) == 2, live
    assert BUILDER not in str(live), live
    await _drop_work(embedded)
    await _reindex(embedded)
    assert await indexed() == live


async def _hand(embedded: Embedded, person: Any, who: str, ref: str, text: str) -> None:
    repo, _, number = ref.partition("#")
    await person(who).comment(repo, int(number), text)
    await embedded.forge.webhooks_idle()
    await embedded.settle()


async def _seen_by(tools: Any, readers: list[str], refs: list[str]) -> dict[str, Any]:
    """What each reader is shown of `refs` (decisions, threads) and in their inbox, read
    comments included, once all of it is marked read (a rebuild's deliveries are read)."""
    for who in readers:
        await tools(who)("list_inbox")
    out: dict[str, Any] = {}
    for who in readers:
        t = tools(who)
        out[who] = _unordered(_still({
            "inbox": await t("list_inbox", markRead=False, read=True),
            "outcomes": [await t("get_outcome", outcome=r) for r in refs]}))
    return out


def _unordered(x: Any) -> Any:
    """Lists as sets: items made within a second of each other are ordered by the index's
    clock live and by the forge's (to the second) in a rebuild."""
    if isinstance(x, dict):
        return {k: _unordered(v) for k, v in x.items()}
    if isinstance(x, list):
        return sorted((_unordered(v) for v in x), key=repr)
    return x


async def test_a_rebuild_reads_forge_commands_as_live_did(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """Review of issues 25/26: the rebuild read `/answer`, `/confirmed` and `/reply` its own
    way, and its index differed from the live one it replaced: `/answer ²` (a digit, not an
    ASCII one) was an answer in words live and nothing in a rebuild; marco's `/answer` to a
    question asking his agent scout (a reply in the thread live) was dropped; his
    `/reply <id>` naming a plain thread, with two open, was dropped; scout's relay `/answer 2`
    with a line `/confirmed <what marco said>` lost marco's words."""
    from tests.items_support import make_item

    sara, marco = tools("human:sara@acme.com"), person("marco")
    words = await make_item(embedded, marco, "outcome", "Colours")
    digits = await sara("add_comment", target=words, targetType="outcome", to=["marco@acme.com"],
                        body="Which colour?", options=[{"label": "Red"}, {"label": "Blue"}])
    await embedded.settle()
    await _hand(embedded, person, "marco", words, "/answer \u00b2")

    to_agent = await make_item(embedded, marco, "outcome", "Shapes")
    await sara("add_comment", target=to_agent, targetType="outcome", to=["agent:scout"],
               body="Which shape?", needsReply=True)
    await embedded.settle()
    await _hand(embedded, person, "marco", to_agent, "/answer round, scout")

    plain = await make_item(embedded, marco, "outcome", "Sizes")
    first = await sara("add_comment", target=plain, targetType="outcome",
                       to=["marco@acme.com"], body="Pick a size")
    await sara("add_comment", target=plain, targetType="outcome", to=["marco@acme.com"],
               body="Pick a weight")
    await embedded.settle()
    await _hand(embedded, person, "marco", plain, f"/reply {first['comment']['id']} large")

    relayed = await make_item(embedded, marco, "outcome", "Fonts")
    await sara("add_comment", target=relayed, targetType="outcome", to=["marco@acme.com"],
               body="Which font?", options=[{"label": "Serif"}, {"label": "Sans"}])
    await embedded.settle()
    await _hand(embedded, person, "scout-bot", relayed, "/answer 2\n/confirmed marco: sans")

    refs = [words, to_agent, plain, relayed]
    readers = ["human:sara@acme.com", "human:marco@acme.com", "agent:scout"]
    before = await _seen_by(tools, readers, refs)
    said = {d["thread"]: d["answer"] for d in before["human:sara@acme.com"]["outcomes"][0]
            ["decisions"]}
    assert (said[digits["comment"]["id"]]["option"],
            said[digits["comment"]["id"]]["body"]) == (None, "\u00b2")
    fonts = before["human:sara@acme.com"]["outcomes"][3]["decisions"]
    assert [(d["answer"]["option"], d["answer"]["body"]) for d in fonts] == [
        ("Sans", "marco: sans")]
    assert "large" in str(before["human:sara@acme.com"]["inbox"])
    assert "round, scout" in str(before["human:sara@acme.com"]["inbox"])
    await _drop_work(embedded)
    await _reindex(embedded)
    after = await _seen_by(tools, readers, refs)
    for who in readers:
        assert after[who] == before[who], who


async def test_an_answer_written_while_its_question_was_resolved_stays_out_of_a_rebuild(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """Review of issues 25/26: `/answer` looks only at open questions, so marco's second
    `/answer` after scout resolved the question was refused and the decision stayed his first.
    The forge does not say when a tool resolved it, and a rebuild took the second as a changed
    answer: the decision came back "Blue" (words) and "Sans" with a history (an option). The
    card, sealed, shows each answer the app took: a hand answer it does not show is not one."""
    from tests.items_support import make_item

    scout = tools("agent:scout")
    refs, asked = [], []
    for title, ask in (("Colours", {"needsReply": True}),
                       ("Fonts", {"options": [{"label": "Serif"}, {"label": "Sans"}]})):
        ref = await make_item(embedded, person("marco"), "outcome", title)
        q = await scout("add_comment", target=ref, targetType="outcome", to=["marco@acme.com"],
                        body=f"Which of the {title.lower()}?", **ask)
        await embedded.settle()
        refs.append(ref)
        asked.append(q["comment"]["id"])
    await _hand(embedded, person, "marco", refs[0], "/answer Red")
    await _hand(embedded, person, "marco", refs[1], "/answer 1")
    for q in asked:
        await scout("resolve_comment", comment=q)
    await _hand(embedded, person, "marco", refs[0], "/answer Blue")
    await _hand(embedded, person, "marco", refs[1], "/answer 2")
    readers = ["human:marco@acme.com", "agent:scout"]
    before = await _seen_by(tools, readers, refs)
    assert [[(d["answer"]["option"], d["answer"]["body"], d["history"], d["resolved"])
             for d in o["decisions"]] for o in before["agent:scout"]["outcomes"]] == [
        [(None, "Red", [], True)], [("Serif", "", [], True)]]
    await _drop_work(embedded)
    await _reindex(embedded)
    after = await _seen_by(tools, readers, refs)
    for who in readers:
        assert after[who] == before[who], who


def _differences(was: Any, now: Any, at: str = "") -> list[str]:
    """Where two snapshots differ, leaf by leaf (what an assertion tells of a rebuild)."""
    if isinstance(was, dict) and isinstance(now, dict):
        return [d for k in sorted(was.keys() | now.keys())
                for d in _differences(was.get(k), now.get(k), f"{at}.{k}")]
    if isinstance(was, list) and isinstance(now, list) and len(was) == len(now):
        return [d for n, (a, b) in enumerate(zip(was, now, strict=True))
                for d in _differences(a, b, f"{at}[{n}]")]
    return [] if was == now else [f"{at}: {str(was)[:80]!r} -> {str(now)[:80]!r}"]


async def _edit(embedded: Embedded, person: Any, who: str, ref: str, find: str,
                body: str) -> None:
    """`who` edits, on the forge and a few seconds after it was written (the forge stamps to
    the second), the comment on `ref` that reads `find`, to read `body`."""
    from tests.items_support import forge_comments

    repo, _, _ = ref.partition("#")
    them = person(who)
    mine = next(c for c in await forge_comments(them, ref) if c["body"] == find)
    embedded.forge.clock.advance(5)
    await them.call("PATCH", f"/repos/{repo}/issues/comments/{mine['id']}", {"body": body},
                    expect=200)
    await embedded.forge.webhooks_idle()
    await embedded.settle()


async def test_an_answer_taken_live_and_edited_since_is_rebuilt_as_it_was_taken(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """An `/answer` the app took, edited on the forge after: live the answer stands (an edit
    answers nothing, and changes nothing that was answered) and the comment reads as edited;
    a rebuild read the comment as edited since it was written, took none of its commands, and
    the answer was gone: sara's question read open again, her turn again. sara fixes a typo
    in her own answer; marco (write access) rewrites scout's relay of his answer and his own
    first answer, which he changed since. The card the app sealed when it took each answer
    names the comment that gave it: a rebuild takes that answer from it, whatever the comment
    says now, and the comment's words as the forge shows them."""
    from tests.items_support import make_item

    scout, sara, marco = (tools("agent:scout"), tools("human:sara@acme.com"),
                          person("marco"))
    regions = await make_item(embedded, marco, "outcome", "Regions")
    await scout("add_comment", target=regions, targetType="outcome", to=["sara@acme.com"],
                body="Which region?", needsReply=True)
    fonts = await make_item(embedded, marco, "outcome", "Fonts")
    await sara("add_comment", target=fonts, targetType="outcome", to=["marco@acme.com"],
               body="Which font?", options=[{"label": "Serif"}, {"label": "Sans"}])
    sizes = await make_item(embedded, marco, "outcome", "Sizes")
    await sara("add_comment", target=sizes, targetType="outcome", to=["marco@acme.com"],
               body="Which size?", options=[{"label": "Small"}, {"label": "Large"}])
    await embedded.settle()
    await _hand(embedded, person, "sara", regions, "/answer EU pleas")
    await _hand(embedded, person, "scout-bot", fonts, "/answer 2\n/confirmed marco: sans")
    await _hand(embedded, person, "marco", sizes, "/answer 1")
    await _hand(embedded, person, "marco", sizes, "/answer 2\nafter all")
    await _edit(embedded, person, "sara", regions, "/answer EU pleas", "/answer EU please")
    await _edit(embedded, person, "marco", fonts, "/answer 2\n/confirmed marco: sans",
                "/answer 1\n/confirmed marco: serif")
    await _edit(embedded, person, "marco", sizes, "/answer 1", "/answer 2")
    refs = [regions, fonts, sizes]
    readers = ["human:sara@acme.com", "human:marco@acme.com", "agent:scout"]
    before = await _seen_by(tools, readers, refs)
    decided = [[(d["answer"]["option"], d["answer"]["body"], d["decidedBy"],
                 [(h["option"], h["body"]) for h in d["history"]]) for d in o["decisions"]]
               for o in before["agent:scout"]["outcomes"]]
    assert decided == [[(None, "EU pleas", "human:sara@acme.com", [])],
                       [("Sans", "marco: sans", "human:marco@acme.com", [])],
                       [("Large", "after all", "human:marco@acme.com", [("Small", "")])]], \
        decided
    await _drop_work(embedded)
    await _reindex(embedded)
    after = await _seen_by(tools, readers, refs)
    for who in readers:
        assert after[who] == before[who], "\n".join([who, *_differences(before[who], after[who])])
    again = await _reindex(embedded)
    assert again.work is not None and (again.work.comments, again.work.questions) == (0, 0)
    assert await _seen_by(tools, readers, refs) == after


async def test_an_ask_edited_on_the_forge_is_its_question_in_a_rebuild(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """An `/ask` the forge shows edited since it was written: the app's own edit taking an
    option's `then` note out of it (which lands a second or more after it was written as
    often as not), or its asker's. Live it is the question's comment, its words as the forge
    shows them after a person's edit; a rebuild read it as an edited comment, words alone,
    and a thread of those words came back beside the question, reaching those the item
    reaches. The card names the comment that asked it: a rebuild takes it as the question's."""
    from tests.items_support import forge_comments, make_item

    marco = person("marco")
    currency = await make_item(embedded, marco, "outcome", "Currency")
    repo, _, number = currency.partition("#")
    held = embedded.forge.faults.hold("PATCH /repos/{owner}/{repo}/issues/comments/{comment_id}",
                                      count=1, repo=repo)
    asked = "/ask Which currency first? @sara\n- [ ] EUR <!-- then: price list A -->\n- [ ] Local"
    mine = await marco.comment(repo, int(number), asked)
    await held.caught_at_least(1)  # the app takes `then` out of it, later than its second
    embedded.forge.clock.advance(5)
    held.release()
    await embedded.forge.webhooks_idle()
    await embedded.settle()
    now = next(c for c in await forge_comments(marco, currency) if c["id"] == mine["id"])
    assert "then:" not in now["body"] and now["updated_at"] != now["created_at"], now
    colours = await make_item(embedded, marco, "outcome", "Colours")
    await _hand(embedded, person, "marco", colours, "/ask Which colour? @sara")
    await _edit(embedded, person, "marco", colours, "/ask Which colour? @sara",
                "/ask Which colour, really? @sara")
    refs = [currency, colours]
    readers = ["human:sara@acme.com", "human:marco@acme.com", "agent:scout"]
    before = await _seen_by(tools, readers, refs)
    await _drop_work(embedded)
    await _reindex(embedded)
    after = await _seen_by(tools, readers, refs)
    for who in readers:
        assert after[who] == before[who], "\n".join([who, *_differences(before[who], after[who])])


async def test_each_tick_a_card_shows_is_rebuilt_in_its_place(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """marco ticks Small on sara's card, then changes his answer with `/answer 2`, then ticks
    Small again. A tick has no comment on the forge, and a rebuild took one only where it was
    the card's answer now: the first tick was gone from the history, and `/answer 2` read as
    the first answer, not a change. The card's marks name each answer's comment, a tick's
    too: one no comment on the forge gave is a tick, replayed where the card shows it."""
    from tests.items_support import forge_comments, make_item

    sara, marco = tools("human:sara@acme.com"), person("marco")
    sizes = await make_item(embedded, marco, "outcome", "Sizes")
    asked = await sara("add_comment", target=sizes, targetType="outcome", to=["marco@acme.com"],
                       body="Which size?", options=[{"label": "Small"}, {"label": "Large"}])
    await embedded.settle()
    repo, _, _ = sizes.partition("#")

    async def tick(box: str) -> None:
        card = next(c for c in await forge_comments(marco, sizes)
                    if f"id={asked['comment']['id']} kind=question" in c["body"])
        await marco.call("PATCH", f"/repos/{repo}/issues/comments/{card['id']}",
                         {"body": card["body"].replace(f"- [ ] {box}.", f"- [x] {box}.", 1)},
                         expect=200)
        await embedded.forge.webhooks_idle()
        await embedded.settle()

    await tick("1")
    await _hand(embedded, person, "marco", sizes, "/answer 2\nbigger")
    await tick("1")
    readers = ["human:sara@acme.com", "human:marco@acme.com", "agent:scout"]
    before = await _seen_by(tools, readers, [sizes])
    [decided] = before["human:sara@acme.com"]["outcomes"][0]["decisions"]
    assert (decided["answer"]["option"], [(h["option"], h["body"]) for h in decided["history"]]
            ) == ("Small", [("Large", "bigger"), ("Small", "")]), decided
    await _drop_work(embedded)
    await _reindex(embedded)
    after = await _seen_by(tools, readers, [sizes])
    for who in readers:
        assert after[who] == before[who], "\n".join([who, *_differences(before[who], after[who])])


async def test_a_command_an_edit_adds_does_nothing_in_a_rebuild_as_live(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """What an edit can make a rebuild do that live did not: marco (write access) edits
    sara's words, written before her `/answer EU`, into that same `/answer EU` (the card
    shows sara answered EU: read by its words, the edited comment could take the answer
    from the one that gave it), another of hers into a `/reply` in scout's thread, and
    scout's words into a `/confirmed` relay of his answer to sara's question and an `/ask`.
    Live none of it runs; in a rebuild none of it does either: only the comment the card
    names answers, and the rest are words as the forge shows them."""
    from tests.items_support import make_item

    scout, sara, marco = tools("agent:scout"), tools("human:sara@acme.com"), person("marco")
    regions = await make_item(embedded, marco, "outcome", "Regions")
    asked = await scout("add_comment", target=regions, targetType="outcome",
                        to=["sara@acme.com"], body="Which region?", needsReply=True)
    fonts = await make_item(embedded, marco, "outcome", "Fonts")
    await sara("add_comment", target=fonts, targetType="outcome", to=["marco@acme.com"],
               body="Which font?", options=[{"label": "Serif"}, {"label": "Sans"}])
    await embedded.settle()
    await _hand(embedded, person, "sara", regions, "I'll check with legal")
    await _hand(embedded, person, "sara", regions, "Also the DPA")
    await _hand(embedded, person, "sara", regions, "/answer EU")
    await _hand(embedded, person, "scout-bot", fonts, "Looking into it")
    await _hand(embedded, person, "scout-bot", fonts, "Still looking")
    await _edit(embedded, person, "marco", regions, "I'll check with legal", "/answer EU")
    await _edit(embedded, person, "marco", regions, "Also the DPA",
                f"/reply {asked['comment']['id']} US too")
    await _edit(embedded, person, "marco", fonts, "Looking into it",
                "/answer 1\n/confirmed marco: serif")
    await _edit(embedded, person, "marco", fonts, "Still looking",
                "/ask Which weight? @marco\n- [ ] Bold\n- [ ] Light")
    refs = [regions, fonts]
    readers = ["human:sara@acme.com", "human:marco@acme.com", "agent:scout"]
    before = await _seen_by(tools, readers, refs)
    decided = [[(d["answer"]["option"], d["answer"]["body"]) for d in o["decisions"]]
               for o in before["agent:scout"]["outcomes"]]
    assert decided == [[(None, "EU")], []], decided
    await _drop_work(embedded)
    await _reindex(embedded)
    after = await _seen_by(tools, readers, refs)
    for who in readers:
        assert after[who] == before[who], "\n".join([who, *_differences(before[who], after[who])])


async def test_an_edit_too_long_to_read_is_not_read_live_nor_fails_a_rebuild(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """sara edits her `/answer EU`, which the app took, and marco his `/ask` and his words,
    to more than the app reads of a comment (`render.MAX_COMMENT`; GitHub takes 65,536
    characters, Gitea more). Live the edit's delivery failed, retried until it died; a
    rebuild raised on each, and no item of the office was rebuilt. An edit too long to read
    is not read: live and in a rebuild the answer and the question keep their words, and a
    comment known only as edited so (its words then gone) is none, as `index_edited` has it."""
    from tests.items_support import make_item

    scout, marco = tools("agent:scout"), person("marco")
    regions = await make_item(embedded, marco, "outcome", "Regions")
    await scout("add_comment", target=regions, targetType="outcome", to=["sara@acme.com"],
                body="Which region?", needsReply=True)
    await embedded.settle()
    await _hand(embedded, person, "sara", regions, "/answer EU")
    colours = await make_item(embedded, marco, "outcome", "Colours")
    await _hand(embedded, person, "marco", colours, "/ask Which colour? @sara")
    long = "x" * 17_000
    await _edit(embedded, person, "sara", regions, "/answer EU", f"/answer EU {long}")
    await _edit(embedded, person, "marco", colours, "/ask Which colour? @sara",
                f"/ask Which colour? @sara\n{long}")
    refs = [regions, colours]
    readers = ["human:sara@acme.com", "human:marco@acme.com", "agent:scout"]
    before = await _seen_by(tools, readers, refs)
    outcomes = before["agent:scout"]["outcomes"]
    assert [(d["answer"]["body"], d["question"]) for d in outcomes[0]["decisions"]] == [
        ("EU", "Which region?")], outcomes[0]
    assert [t["body"] for t in before["human:sara@acme.com"]["inbox"]["you"]["yourTurn"]] == [
        "Which colour? @sara"], before["human:sara@acme.com"]["inbox"]
    await _hand(embedded, person, "marco", regions, "Noted")
    await _edit(embedded, person, "marco", regions, "Noted", f"Noted {long}")
    await _drop_work(embedded)
    report = await _reindex(embedded)
    assert report.work is not None and report.work.items == 2, report.work
    after = await _seen_by(tools, readers, refs)
    for who in readers:
        assert after[who] == before[who], "\n".join([who, *_differences(before[who], after[who])])


async def test_an_agents_answer_on_the_apps_comment_edited_since_is_rebuilt(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """sara asks scout; scout answers Sans through the app (its comment, sealed); marco (write
    access) edits that comment on the forge. Live nothing changes. A rebuild leaves the
    edited comment out and takes the answer from the card, whose mark names its comment: but
    it read the answerer's name on the card only up to a colon, "agent" for `agent:scout`,
    and the answer was gone (sara's question open again, scout's turn again)."""
    from tests.items_support import make_item

    sara, scout = tools("human:sara@acme.com"), tools("agent:scout")
    fonts = await make_item(embedded, person("marco"), "outcome", "Fonts")
    asked = await sara("add_comment", target=fonts, targetType="outcome", to=["agent:scout"],
                       body="Which font?", options=[{"label": "Serif"}, {"label": "Sans"}])
    await embedded.settle()
    await scout("add_comment", target=fonts, targetType="outcome",
                parent=asked["comment"]["id"], option="Sans", body="sans it is")
    await embedded.settle()
    await _edit_app_comment(embedded, person, "marco", fonts, "💬 **agent:scout**",
                            lambda body: body.replace("sans it is", "serif after all"))
    readers = ["human:sara@acme.com", "human:marco@acme.com", "agent:scout"]
    before = await _seen_by(tools, readers, [fonts])
    assert [(d["answer"]["option"], d["answer"]["body"], d["decidedBy"]) for d in
            before["human:sara@acme.com"]["outcomes"][0]["decisions"]] == [
        ("Sans", "sans it is", "agent:scout")], before["human:sara@acme.com"]["outcomes"]
    await _drop_work(embedded)
    report = await _reindex(embedded)
    assert report.work is not None and len(report.work.skipped) == 1, report.work
    after = await _seen_by(tools, readers, [fonts])
    for who in readers:
        assert after[who] == before[who], "\n".join([who, *_differences(before[who], after[who])])


async def test_a_question_whose_words_read_like_its_cards_own_lines_is_rebuilt_as_asked(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """A question's words are data on its card, a line of them like one of the card's own
    all the same: sara quotes an earlier card in hers ("**Answered** by marco: Serif",
    "*Resolved.*"), and scout's starts a line as the card's Context fold does. A rebuild
    read the card's status from the first line like one, in sara's words: her question came
    back cut there, without its options, marco's answer dropped and the question resolved;
    and scout's (no context of its own, so no `</details>` after it) raised, and no item of
    the office was rebuilt. The status is the card's last part, and a fold with no end is
    words."""
    from tests.items_support import make_item

    sara, scout = tools("human:sara@acme.com"), tools("agent:scout")
    fonts = await make_item(embedded, person("marco"), "outcome", "Fonts")
    await sara("add_comment", target=fonts, targetType="outcome", to=["marco@acme.com"],
               body="Last time:\n**Answered** by marco: Serif\n*Resolved.*\nStill right?",
               options=[{"label": "Serif"}, {"label": "Sans"}])
    regions = await make_item(embedded, person("marco"), "outcome", "Regions")
    await scout("add_comment", target=regions, targetType="outcome", to=["sara@acme.com"],
                body="Which region?\n<details><summary>Context</summary>\nsee the DPA",
                needsReply=True)
    await embedded.settle()
    await _hand(embedded, person, "marco", fonts, "/answer 2")
    refs = [fonts, regions]
    readers = ["human:sara@acme.com", "human:marco@acme.com", "agent:scout"]
    before = await _seen_by(tools, readers, refs)
    assert [(d["answer"]["option"], d["resolved"]) for d in
            before["human:sara@acme.com"]["outcomes"][0]["decisions"]] == [("Sans", False)]
    await _drop_work(embedded)
    await _reindex(embedded)
    after = await _seen_by(tools, readers, refs)
    for who in readers:
        assert after[who] == before[who], "\n".join([who, *_differences(before[who], after[who])])


async def _copy_onto(embedded: Embedded, person: Any, who: str, source: str, find: str,
                     target: str, onto: str) -> int:
    """`who` (write access) edits the app's comment on `target` holding `onto` into an exact
    copy of the app's comment on `source` holding `find`, seal and all. Returns the edited
    comment's forge id."""
    from tests.items_support import forge_comments

    them = person(who)
    body = next(c for c in await forge_comments(them, source) if find in c["body"])["body"]
    mine = next(c for c in await forge_comments(them, target) if onto in c["body"])
    await them.call("PATCH", f"/repos/{target.partition('#')[0]}/issues/comments/{mine['id']}",
                    {"body": body}, expect=200)
    await embedded.forge.webhooks_idle()
    await embedded.settle()
    return int(mine["id"])


async def _card_copied(embedded: Embedded, tools: Any, person: Any, *,
                       repo: str | None) -> None:
    """sara asks marco on `one`, marco decides; scout (or, in another repository, marco)
    comments on `two`; marco edits that comment of the app's into an exact copy of sara's
    sealed card on `one`. Live nothing changes; after a reindex sara's question and marco's
    decision are on `one` still, nothing is on `two`, and the report names the copy."""
    from bot.store import comments as db
    from tests.items_support import MARCO, SARA, TOKEN_TTL, make_item

    # (the copy's item made first where it can sort first: a rebuild replays in ref order)
    if repo is not None:
        owner, name = repo.split("/")
        embedded.forge.add_repo(owner, name)
        embedded.forge.set_permission(repo, "marco", "admin")
        two = await make_item(embedded, person("marco"), "outcome", "Elsewhere", repo=repo)
    one = await make_item(embedded, person("marco"), "outcome", "Sessions")
    if repo is None:
        two = await make_item(embedded, person("marco"), "outcome", "Logs")
    sara, marco = tools(SARA), tools(MARCO)
    asked = (await sara("add_comment", target=one, **TOKEN_TTL))["comment"]["id"]
    await embedded.settle()
    await marco("add_comment", target=one, targetType="outcome", parent=asked,
                option="Keep 30 days", body="keep them")
    writer = tools("agent:scout") if repo is None else marco
    await writer("add_comment", target=two, targetType="outcome", body="Checking the logs")
    await embedded.settle()
    forged = await _copy_onto(embedded, person, "marco", one, "kind=question", two,
                              "Checking the logs")
    live = {r: _decided(await marco("get_outcome", outcome=r)) for r in (one, two)}
    assert asked in live[one] and not live[two], live
    await _drop_work(embedded)
    report = await _reindex(embedded)
    assert {r: _decided(await marco("get_outcome", outcome=r)) for r in (one, two)} == live
    thread = await db.get_thread(embedded.services.store, asked)
    assert thread is not None and thread.item == one, thread
    assert report.work is not None and f"{two} comment {forged}" in report.work.skipped, \
        report.work


async def test_a_sealed_card_copied_onto_another_item_moves_nothing_in_a_rebuild(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """The review's reproduction: marco (write access) edits scout's app comment on item #2
    into an exact copy of sara's sealed card from item #1. The seal covered the text alone,
    so a rebuild took the copy as the app's card on #2: sara's question and marco's decision
    moved there. The seal binds the item it is written on: the copy is a person's edit."""
    await _card_copied(embedded, tools, person, repo=None)


async def test_a_sealed_card_copied_into_another_repository_moves_nothing_in_a_rebuild(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """As above, the copy on an item of another repository of the office."""
    await _card_copied(embedded, tools, person, repo="acme/alpha")


async def test_a_sealed_tool_comment_copied_onto_another_item_is_no_ones_in_a_rebuild(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """marco edits the app's comment of his words on one item into an exact copy of scout's sealed
    comment on another: after a reindex scout's words are on their own item, not on the
    copy's, and the report names the copy."""
    from bot.store import comments as db
    from tests.items_support import make_item

    two = await make_item(embedded, person("marco"), "outcome", "Logs")
    one = await make_item(embedded, person("marco"), "outcome", "Sessions")
    said = await tools("agent:scout")("add_comment", target=one, targetType="outcome",
                                      body="The migration is done")
    await tools("human:marco@acme.com")("add_comment", target=two, targetType="outcome",
                                        body="Checking the logs")
    await embedded.settle()
    forged = await _copy_onto(embedded, person, "marco", one, "The migration is done", two,
                              "Checking the logs")
    await _drop_work(embedded)
    report = await _reindex(embedded)
    got = await db.get_comment(embedded.services.store, said["comment"]["id"])
    assert got is not None and got.item == one, got
    assert report.work is not None and f"{two} comment {forged}" in report.work.skipped, \
        report.work


def _as_v1(embedded: Embedded, body: str) -> str:
    """An app comment's body sealed as releases before seals named their item sealed it (v1:
    the text alone)."""
    import hashlib
    import hmac

    text = body[:body.rindex("<!-- vaultmail:seal ")]
    mac = hmac.new(_key(embedded), text.rstrip().encode(), hashlib.sha256).hexdigest()
    return f"{text}<!-- vaultmail:seal v1={mac} -->\n"


async def test_a_v1_card_holds_on_its_item_and_a_copy_of_it_elsewhere_is_taken_on_neither(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """A card sealed before seals named their item (v1) is still the app's on its own item.
    Its seal holds on any item, so once marco copies it onto the app's comment on another,
    which of the two is the app's cannot be told: a rebuild takes neither, and its report
    names both (`copied`)."""
    from bot.store import comments as db
    from tests.items_support import MARCO, SARA, TOKEN_TTL, forge_comments, make_item

    one = await make_item(embedded, person("marco"), "outcome", "Sessions")
    two = await make_item(embedded, person("marco"), "outcome", "Logs")
    sara, marco = tools(SARA), tools(MARCO)
    asked = (await sara("add_comment", target=one, **TOKEN_TTL))["comment"]["id"]
    await embedded.settle()
    await marco("add_comment", target=one, targetType="outcome", parent=asked,
                option="Keep 30 days", body="keep them")
    await marco("add_comment", target=two, targetType="outcome", body="Checking the logs")
    await embedded.settle()
    card = next(c for c in await forge_comments(person("marco"), one)
                if "kind=question" in c["body"])
    # the card as an older release left it (its own write: no delivery the app acts on)
    embedded.forge.faults.drop_webhooks(count=1)
    await person("marco").call("PATCH", f"/repos/{one.partition('#')[0]}/issues/comments/"
                               f"{card['id']}", {"body": _as_v1(embedded, card["body"])},
                               expect=200)
    await embedded.forge.webhooks_idle()
    await embedded.settle()
    live = {r: _decided(await marco("get_outcome", outcome=r)) for r in (one, two)}
    assert asked in live[one] and not live[two], live
    await _drop_work(embedded)
    report = await _reindex(embedded)
    assert {r: _decided(await marco("get_outcome", outcome=r)) for r in (one, two)} == live
    assert report.work is not None and not report.work.copied, report.work

    forged = await _copy_onto(embedded, person, "marco", one, "kind=question", two,
                              "Checking the logs")
    await _drop_work(embedded)
    report = await _reindex(embedded)
    assert report.work is not None and sorted(report.work.copied) == sorted(
        [f"{one} comment {card['id']}", f"{two} comment {forged}"]), report.work
    assert set(report.work.copied) <= set(report.work.skipped), report.work
    assert not _decided(await marco("get_outcome", outcome=two))
    thread = await db.get_thread(embedded.services.store, asked)
    assert thread is None or thread.item == one, thread


async def test_a_v1_card_is_sealed_to_its_item_when_the_app_next_rewrites_it(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """A card an older release sealed (v1, naming no item) is redrawn with a seal bound to its
    item the next time the app rewrites it (here: marco changes his answer)."""
    from tests.items_support import MARCO, SARA, TOKEN_TTL, forge_comments, make_item

    one = await make_item(embedded, person("marco"), "outcome", "Sessions")
    sara, marco = tools(SARA), tools(MARCO)
    asked = (await sara("add_comment", target=one, **TOKEN_TTL))["comment"]["id"]
    await embedded.settle()
    await marco("add_comment", target=one, targetType="outcome", parent=asked,
                option="Keep 30 days", body="keep them")
    await embedded.settle()

    async def card() -> dict[str, Any]:
        return next(c for c in await forge_comments(person("marco"), one)
                    if "kind=question" in c["body"])

    was = await card()
    embedded.forge.faults.drop_webhooks(count=1)
    await person("marco").call("PATCH", f"/repos/{one.partition('#')[0]}/issues/comments/"
                               f"{was['id']}", {"body": _as_v1(embedded, was["body"])},
                               expect=200)
    await embedded.forge.webhooks_idle()
    await _drop_work(embedded)  # the index as the older release's rebuild left it
    await _reindex(embedded)
    assert "<!-- vaultmail:seal v1=" in (await card())["body"]
    await marco("add_comment", target=one, targetType="outcome", parent=asked,
                option="Force re-login", body="changed my mind", amend=True)
    await embedded.settle()
    assert "<!-- vaultmail:seal v2=" in (await card())["body"]


async def test_a_card_sealed_before_its_repository_was_renamed_holds_in_a_rebuild(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """The seal binds its issue's forge id, not the repository's name: after acme/alpha is
    renamed acme/beta, a rebuild takes sara's card there, with marco's decision."""
    from tests.items_support import MARCO, SARA, TOKEN_TTL, make_item

    embedded.forge.add_repo("acme", "alpha")
    for who in ("marco", "sara"):
        embedded.forge.set_permission("acme/alpha", who, "admin" if who == "marco" else "write")
    one = await make_item(embedded, person("marco"), "outcome", "Sessions", repo="acme/alpha")
    sara, marco = tools(SARA), tools(MARCO)
    asked = (await sara("add_comment", target=one, **TOKEN_TTL))["comment"]["id"]
    await embedded.settle()
    await marco("add_comment", target=one, targetType="outcome", parent=asked,
                option="Keep 30 days", body="keep them")
    await embedded.settle()
    embedded.forge.rename_repo("acme/alpha", "beta")
    await embedded.forge.webhooks_idle()
    await embedded.settle()
    await _drop_work(embedded)
    report = await _reindex(embedded)
    assert report.work is not None and not report.work.skipped, report.work
    now = one.replace("acme/alpha", "acme/beta")
    assert asked in _decided(await marco("get_outcome", outcome=now))
