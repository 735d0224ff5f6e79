"""Items in the forge by hand (DESIGN §3.6): comments that address people (`to:` / `cc:` lines,
@mentions), `/ask`, `/answer`, `/resolve`, ticks in question cards, and the issue events that
make updates on outcomes (status, plans, evidence, claims).

Mail issues and `/mail` belong to handlers.comments and handlers.mail; this router leaves them.
"""

from __future__ import annotations

import time
from typing import Any

from gidgethub import sansio

from bot.app.context import HandlerContext
from bot.app.routing import OrderedRouter
from bot.errors import NotFoundError, VaultmailError
from bot.forge.errors import NotFound
from bot.items import waiting
from bot.items.forge_commands import aim_answer, aim_reply, answering
from bot.items.model import Item, item_from_issue, make_ref
from bot.items.render import (
    MAX_COMMENT,
    has_then,
    marker,
    mention_list,
    mentions,
    parse_addressing,
    parse_ask,
    ticked_option,
    without_then,
)
from bot.items.service import Comments, NewComment
from bot.items.threads import may_answer
from bot.items.views import claim_unnamed
from bot.mail.commands import Command, parse_commands
from bot.mail.markdown import check_length
from bot.office.config import Office
from bot.office.visibility import login_of
from bot.store import comments as db
from bot.store.moves import forge_time
from handlers.common import Scene, actor_of, repo_now, scene
from handlers.item_updates import record_update

router = OrderedRouter()


async def _item_scene(event: sansio.Event, ctx: HandlerContext) -> tuple[Scene, Item] | None:
    s = await scene(event, ctx)
    if s is None:
        return None
    # (what the issue's labels and type make it, first: a vault's mail is none, and is not
    # looked up again after its own handler adopted it)
    item = item_from_issue(s.office, s.repo, s.issue)
    if item is None or await s.mail() is not None:
        return None
    item = await Comments(ctx.services, ctx.forge, s.office).with_native_parent(
        item, s.issue, opened=event.data.get("action") == "opened")
    return s, item


def office_entries(office: Office, raw: list[str]) -> list[str]:
    """Forge spellings as `to` entries: @login → email or agent:<slug>, @org/team → team:<key>.

    A mention of someone outside the office is left to the forge (it has notified them)."""
    out: list[str] = []
    for entry in raw:
        if not entry.startswith("@"):
            out.append(entry)
            continue
        name = entry[1:]
        if "/" in name:
            org, _, team = name.partition("/")
            if org.lower() == office.org.lower() and team in office.teams:
                out.append(f"team:{team}")
            continue
        who = office.by_login(name)
        if who is not None:  # a person by email, an agent by agent:<slug>
            out.append(who.principal.removeprefix("human:"))
    return list(dict.fromkeys(out))


@router.register("issue_comment", action="created")
async def comment_on_item(event: sansio.Event, ctx: HandlerContext) -> None:
    found = await _item_scene(event, ctx)
    if found is None:
        return
    s, item = found
    comment = event.data["comment"]
    gone = await db.comment_by_forge_id(ctx.services.store, int(comment["id"]), item.ref)
    if gone is not None and gone.deleted_at is not None:
        return  # deleted on the forge before this (late) `created` came: nothing of it is read
    if s.no_one:  # edited since it was written (handle_comment notes it): words alone
        await index_edited(s, item, comment)
        return
    text = str(comment.get("body") or "")
    commands = parse_commands(text)
    if any(c.name == "mail" for c in commands):
        return  # /mail is the mail handler's
    service = Comments(ctx.services, ctx.forge, s.office)
    try:
        # anyone may comment here: a comment too long to be one is refused unread (and the
        # refusal to someone outside the office is said once, then only ledgered)
        check_length(text, limit=MAX_COMMENT)
        item = await service.index_item(item)  # a comment says nothing of the body's link
        by_name = {c.name: c for c in commands}
        addressed = parse_addressing(text)
        to, cc = office_entries(s.office, addressed.to), office_entries(s.office, addressed.cc)
        hidden = claim_unnamed(item, [*to, *cc])  # (its notes name no hidden claim holder)
        forge_id = int(comment["id"])
        if "ask" in by_name:
            ask = parse_ask(by_name["ask"].args, by_name["ask"].body)
            added = await service.add(s.actor, item, NewComment(
                body=ask.body, to=to, cc=cc, needs_reply=True, options=ask.options or None,
                header=ask.header, human_only=ask.human_only, context=ask.context,
                forge_id=forge_id))
            if has_then(text):  # the asker's own notes: in the index now, out of the forge
                await ctx.forge.update_comment(s.repo, forge_id, without_then(text))
        elif "answer" in by_name or "confirmed" in by_name:
            cmd = answering(by_name)  # (with `/confirmed <what they said>`'s words)
            assert cmd is not None
            added, was = await answer_from_forge(service, s, item, cmd, forge_id, to=to,
                                                 cc=cc, confirmed="confirmed" in by_name)
            await ping_addressed(s, text, added, hidden=hidden, was_waiting=was)
        elif "reply" in by_name:
            added, was = await reply_from_forge(service, s, item, by_name["reply"], forge_id,
                                                to=to, cc=cc)
            await ping_addressed(s, text, added, hidden=hidden, was_waiting=was)
        elif "resolve" in by_name:
            await resolve_from_forge(service, s, item, by_name["resolve"])
        else:
            added = await service.add(s.actor, item, NewComment(
                body=addressed.body or text, to=to, cc=cc, forge_id=forge_id))
            await ping_addressed(s, text, added, hidden=hidden)
    except VaultmailError as exc:
        await s.refuse(exc)


async def index_edited(s: Scene, item: Item, comment: dict[str, Any]) -> None:
    """A comment the forge shows edited since it was written, by whom it does not say
    (bot.app.org_signed): indexed as an edit after its `created` would leave it, its author's
    (the forge says who) in its words now, marked edited, but as an edit: no command run, no
    question answered, no one addressed (`words_edited`), since its author may not have
    written them."""
    author = await actor_of(s.ctx, s.office, comment.get("user") or {"login": "ghost"})
    text = str(comment.get("body") or "")
    service = Comments(s.ctx.services, s.ctx.forge, s.office)
    try:
        check_length(text, limit=MAX_COMMENT)
        await service.add(author, await service.index_item(item), NewComment(
            body=parse_addressing(text).body or text, forge_id=int(comment["id"]),
            edited_at=forge_time(comment.get("updated_at")) or time.time()))
    except VaultmailError as exc:  # (said to no one: the words may not be its author's)
        s.ctx.log.info("an edited comment was not indexed", extra={
            "reason": exc.message, "issue": s.ref})


async def ping_addressed(s: Scene, text: str, added: dict[str, Any], *,
                         hidden: str | None = None,
                         was_waiting: tuple[str, ...] | None = None) -> None:
    """People a `to:` / `cc:` line names by email or team are reached personally, but the forge
    notifies only @-mentions: the app mentions them, once, in a short note. So it does for
    those whose turn a reply in a question's thread made it (`was_waiting`: whose it was), and
    for an agent addressed, asked or given the turn, by its own account: what reaches it
    through its person's box would otherwise never show in its forge notifications. Not the
    claim holder of an outcome elsewhere the comment does not name (`hidden`: as
    Comments.add, `views.claim_unnamed`)."""
    mentioned = {m.lower() for m in mentions(text)}
    for entry in office_entries(s.office, [f"@{m}" for m in mentions(text) if "/" in m]):
        team = s.office.teams.get(entry.removeprefix("team:"), [])
        mentioned |= {h.login.lower() for e in team if (h := s.office.human(e))}
    started = added["comment"]["id"] == added["comment"]["thread"]  # a question it asks
    asked = set(added["thread"].get("askedTo") or ()) if started else set()
    turned = set(added["thread"].get("waitingOn") or ()) - set(was_waiting) \
        if was_waiting is not None else set()
    answer = added["thread"].get("answer") or {}
    if answer.get("comment") == added["comment"]["id"]:  # an answer, or a changed one
        turned.add(added["thread"]["askedBy"])
    missing = [login for r in added["notify"]
               if (r["way"] == "personal" or r["principal"].startswith("agent:"))
               and (r["principal"] in added["addressed"] or r["principal"] in asked
                    or r["principal"] in turned)
               and r["principal"] != hidden  # (past the loop guard it notified no agent)
               and (login := login_of(s.office, r["principal"])) and login.lower()
               not in mentioned]
    if missing:
        mark = marker(added['comment']['id'], kind='ping')
        note = f"{mark}\n{mention_list(missing)}: @{s.login}'s comment above is for you."
        await s.ctx.post_once(s.repo, s.number, note, mark)


async def answer_from_forge(service: Comments, s: Scene, item: Item, cmd: Command,
                            forge_id: int, *, to: list[str], cc: list[str],
                            confirmed: bool = False) -> tuple[dict[str, Any], tuple[str, ...]]:
    """`/answer` (or `/confirmed`: an agent relaying its person's answer). With a `to:` line
    naming someone new it passes the question on instead (`to: me`: to the agent's person)."""
    threads = await db.open_threads(s.ctx.services.store, item=item.ref)
    aimed = aim_answer(s.office, s.actor, item.ref, threads, cmd)
    t, option, body = aimed.thread, aimed.option, aimed.body
    answers = may_answer(t.state, s.office, s.actor, confirmed=confirmed)
    added = await service.add(s.actor, item, NewComment(
        body=body, parent=t.id, option=option, amend=answers and t.state.answer is not None,
        to=to, cc=cc, confirmed=confirmed, forge_id=forge_id))
    # passed on: it asks someone new (the view the writer is given may leave out one it
    # asked before, a claim holder hidden from them: views.hidden_claims)
    if set(added["thread"].get("askedTo") or ()) - set(t.state.asked):
        return added, t.state.waiting_on
    if not answers and s.actor != t.state.asker:  # they meant to answer: say how it was taken
        asks = await _asks(service, item, t)
        await s.say(f"your `/answer` is a reply in thread `{t.id}`, not the answer: "
                    + (f"the question asks {asks}, and only they answer it" if asks
                       else "only those the question asks answer it"))
    return added, t.state.waiting_on


async def _asks(service: Comments, item: Item, t: db.ThreadRow) -> str:
    """Whom `t`'s question asks, for a note on the forge (read by all who read `item`,
    indexed): as its card names them, not a claim holder it may not name (`unnamed_in`)."""
    hidden = await service.unnamed_in(item, t)
    return ", ".join(p for p in t.state.asked if p != hidden)


async def reply_from_forge(service: Comments, s: Scene, item: Item, cmd: Command,
                           forge_id: int, *, to: list[str],
                           cc: list[str]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """`/reply [<header or id>] <words>`: a reply in a thread, as `add_comment` with `parent`
    makes one: the asker's follow-up, a pass-on (`to:` naming someone new; `to: me` hands an
    agent's question to its person), or words that reach everyone in the thread. Without a
    name, the only open thread on the item the commenter is in."""
    threads = await db.open_threads(s.ctx.services.store, item=item.ref)
    aimed = aim_reply(s.office, s.actor, item.ref, threads, cmd)
    target, body = aimed.thread, aimed.body
    return await service.add(s.actor, item, NewComment(
        body=body, parent=target.id, to=to, cc=cc, forge_id=forge_id)), target.state.waiting_on


async def resolve_from_forge(service: Comments, s: Scene, item: Item, cmd: Command) -> None:
    target = cmd.args.strip().split()[0] if cmd.args.strip() else None
    if target is None:
        mine = [t for t in await db.open_threads(s.ctx.services.store, item=item.ref)
                if t.state.asker == s.actor]
        if not mine:
            raise NotFoundError(f"no open thread of yours on {item.ref}; use `/resolve <id>` "
                                "with the comment id shown in its card")
        target = mine[0].id
    found = await db.get_comment(s.ctx.services.store, target)
    if found is None or found.item != item.ref:  # a thread elsewhere is not this item's: and
        # is not named, so a comment never tells of an item its reader may not see
        raise NotFoundError(f"no comment {target!r} on {item.ref}; use `/resolve <id>` with "
                            "the comment id shown in a card on this item")
    await service.resolve(s.actor, target)


@router.register("issue_comment", action="deleted")
async def comment_deleted(event: sansio.Event, ctx: HandlerContext) -> None:
    """A comment was deleted on the forge: the index lets it go (`Comments.forge_deleted`)."""
    found = await _item_scene(event, ctx)
    if found is None:
        return
    s, item = found
    comment = event.data["comment"]
    author = await actor_of(ctx, s.office, comment.get("user") or {"login": "ghost"})
    service = Comments(ctx.services, ctx.forge, s.office)
    # (as indexed, with its outcome's claim: the card it rewrites names no hidden holder)
    await service.forge_deleted(s.actor, await service.index_item(item), int(comment["id"]),
                                author)


async def words_edited(s: Scene, item: Item, forge_id: int) -> None:
    """A comment's words were edited on the forge: read back from it (a delivery's words and
    sender are not proof of what the forge shows: bot.app.org_signed) and shown in the index
    as they are now. The app's own comments are its renderings, not anyone's words."""
    try:
        found = await s.ctx.forge.get_comment(s.repo, forge_id)
    except NotFound:
        return  # deleted since: its `deleted` follows
    if s.ctx.services.by_app(found):
        return
    await Comments(s.ctx.services, s.ctx.forge, s.office).forge_edited(
        item, forge_id, str(found.get("body") or ""))


@router.register("issue_comment", action="edited")
async def card_edited(event: sansio.Event, ctx: HandlerContext) -> None:
    """A person ticked a box in a question card (the app's own edits never reach here), or
    edited a comment of their own (`words_edited`)."""
    found = await _item_scene(event, ctx)
    if found is None:
        return
    s, item = found
    store = ctx.services.store
    t = await db.thread_by_card(store, int(event.data["comment"]["id"]), item.ref)
    if t is None:
        await words_edited(s, item, int(event.data["comment"]["id"]))
        return
    if t.state.question is None or t.card_body is None or t.card_id is None:
        return
    if s.no_one:  # an edit no one can be shown to have made: it answers in no one's name
        await ctx.forge.update_comment(s.repo, t.card_id, t.card_body)
        await s.note(f"a tick in question card {t.id} was undone: this forge does not say who "
                     "edits a comment, so a tick answers nothing here. Answer with `/answer "
                     f"{t.id} <option number>` instead.")
        return
    service = Comments(ctx.services, ctx.forge, s.office)
    choice = ticked_option(t.card_body, t.state.question,
                           str(event.data["comment"].get("body") or ""))
    if choice is not None and may_answer(t.state, s.office, s.actor):
        try:
            await service.add(s.actor, await service.index_item(item), NewComment(
                parent=t.id, option=choice + 1, amend=t.state.answer is not None, quiet=True))
            return
        except VaultmailError as exc:
            await ctx.forge.update_comment(s.repo, t.card_id, t.card_body)
            await s.say(f"your tick was undone: {exc.on_forge}")
            return
    await ctx.forge.update_comment(s.repo, t.card_id, t.card_body)
    if choice is not None or not may_answer(t.state, s.office, s.actor):
        asks = await _asks(service, await service.index_item(item), t)
        reason = f"only the people it asks{f' ({asks})' if asks else ''} can tick its boxes"
        await service.deny(s.actor, item.ref, f"question card {t.id}: {reason}")
        await s.say(f"your change to the question card was undone: {reason}. Comment in words "
                    "instead.")


@router.register("issues", action="opened")
@router.register("issues", action="edited")
@router.register("issues", action="labeled")
@router.register("issues", action="assigned")
@router.register("issues", action="unassigned")
@router.register("issues", action="closed")
@router.register("issues", action="reopened")
@router.register("issues", action="typed")
@router.register("issues", action="untyped")
async def item_changed(event: sansio.Event, ctx: HandlerContext) -> None:
    found = await _item_scene(event, ctx)
    if found is None:
        return
    s, item = found
    service = Comments(ctx.services, ctx.forge, s.office)
    known = await db.get_item(ctx.services.store, item.ref)
    item = await service.index_item(item, by=_body_by(s, event.data, known))
    await record_update(service, s.actor, item, known, event.data)
    if item.kind == "outcome" and known is not None and known.state != item.state:
        await waiting.sync(service, item.ref)  # a closed outcome waits on nobody


def _body_by(s: Scene, data: dict[str, Any], known: Item | None) -> str | None:
    """Who stands behind the `Part of` line of the body this delivery shows (its issue is the
    forge's as it was at the act): the sender who wrote it (`opened`, a body `edited`) or who
    took the issue in as an item by this act (the body as it stood then). Any other act of
    theirs (a close, a label, an assignee) is not about the body, which may be an outsider's
    edit since: None, judged as a read of the issue is (`Comments._linked`). So is an act
    the forge does not say who made."""
    if s.no_one:
        return None
    wrote = data.get("action") == "opened" or (
        data.get("action") == "edited" and "body" in (data.get("changes") or {}))
    return s.actor if wrote or known is None else None


@router.register("sub_issues", action="parent_issue_added")
@router.register("sub_issues", action="parent_issue_removed")
async def parent_changed(event: sansio.Event, ctx: HandlerContext) -> None:
    """An item got (or lost) its sub-issue parent: the index follows, as it follows a `Part
    of` line. GitHub sends each link twice, `sub_issue_*` to the parent's repository and
    `parent_issue_*` to the sub-issue's; this handles the second, whose repository is the
    item's. A plan or evidence that joins an outcome is news on it, as one opened there is."""
    data = event.data
    repo = await repo_now(ctx, data["repository"])
    office = await ctx.services.offices.get(ctx.forge, repo.split("/")[0])
    sub = data.get("sub_issue")
    if office is None or not isinstance(sub, dict):
        return
    item = item_from_issue(office, repo, sub)  # the REST issue: it says its parent, if any
    if item is None:
        return
    service = Comments(ctx.services, ctx.forge, office)
    known = await db.get_item(ctx.services.store, item.ref)
    actor = await actor_of(ctx, office, data["sender"])
    item = await service.index_item(item, by=actor)
    if item.parent is not None and item.parent != (known.parent if known else None):
        await record_update(service, actor, item, known, {"action": "opened"})


@router.register("issue_dependencies", action="blocked_by_removed")
async def blocker_removed(event: sansio.Event, ctx: HandlerContext) -> None:
    """Someone removed a blocker from an outcome (the app's own changes never reach here).
    Where the office shows waiting by dependency (bot/items/waiting.py) and the outcome's
    questions still wait, the "Waiting on" tracker is put back at once: the forge's view says
    what waits, and it stops when the question is answered or resolved, not when the link is
    cut. Any other blocker is the people's own business and is left alone."""
    data = event.data
    repo = await repo_now(ctx, data["repository"])
    blocked = data.get("blocked_issue")
    if not isinstance(blocked, dict) or "number" not in blocked:
        return
    await _show_waiting_again(ctx, "dependency", repo, int(blocked["number"]))


@router.register("issues", action="field_removed")
async def waiting_field_removed(event: sansio.Event, ctx: HandlerContext) -> None:
    """The same for `waiting: field`: someone cleared an outcome's "Waiting on" issue field
    while its questions still wait, and it is set again."""
    data = event.data
    field = data.get("issue_field")
    issue = data.get("issue")
    if not isinstance(field, dict) or not isinstance(issue, dict) or \
            str(field.get("name", "")).lower() != waiting.FIELD.lower():
        return
    repo = await repo_now(ctx, data["repository"])
    await _show_waiting_again(ctx, "field", repo, int(issue["number"]))


async def _show_waiting_again(ctx: HandlerContext, mode: str, repo: str, number: int) -> None:
    """Where the office shows waiting this way and `repo#number` is an outcome, its waiting
    is written again as its questions have it (a person's undoing is put back)."""
    office = await ctx.services.offices.get(ctx.forge, repo.split("/")[0])
    if office is None or office.waiting != mode:
        return
    ref = make_ref(repo, number)
    known = await db.get_item(ctx.services.store, ref)
    if known is None or known.kind != "outcome":
        return
    await waiting.sync(Comments(ctx.services, ctx.forge, office), ref)
