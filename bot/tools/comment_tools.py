"""The comment tools (DESIGN §3.5): add_comment, resolve_comment, list_inbox, get_outcome,
get_tree; and the `inbox` every agent's tool result carries."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from bot.app.notify import SharedAnswer, Wake
from bot.cursors import Cursors
from bot.errors import InvalidArguments
from bot.items import inbox
from bot.items import tree as work_tree
from bot.items.address import MAX_ADDRESSED
from bot.items.questions import (
    MAX_CONTEXT,
    MAX_DESCRIPTION,
    MAX_HEADER,
    MAX_LABEL,
    MAX_OPTIONS,
    MAX_THEN,
)
from bot.items.service import MAX_BODY, Comments, NewComment
from bot.items.views import (
    DATA_NOTE,
    Sees,
    decision_view,
    hidden_claims,
    item_view,
    parse_time,
    thread_view,
)
from bot.office.visibility import Viewer, viewer_for
from bot.store import comments as db
from bot.store import mails
from bot.tools import outputs
from bot.tools.registry import (
    MAX_ID,
    READS_FORGE,
    READS_INDEX,
    Args,
    Call,
    Hints,
    inbox_provider,
    still_acting,
    tool,
)

MAX_WAIT = 50
DECISIONS = 10  # per level (seed: "the newest 10 each")
REF_MAX = 300  # owner/repo#N, or an item's key
ID_MAX = 100  # a comment's id
ADDRESS = Annotated[str, Field(max_length=320)]  # an email, team:<key>, "agent" or "me"

# Limits the service checks itself, with a message of its own, are shown in the schema by
# `json_schema_extra` (pydantic would refuse first, with its own wording).


def comments_for(call: Call) -> Comments:
    return Comments(call.services, call.forge, call.office)


class OptionArg(BaseModel):
    model_config = ConfigDict(extra="forbid")
    label: str = Field(description="the button: 1 to 5 words, at most 60 characters",
                       json_schema_extra={"maxLength": MAX_LABEL})
    description: str = Field(default="", description="the trade-off, in a sentence",
                             json_schema_extra={"maxLength": MAX_DESCRIPTION})
    then: str = Field(default="", description="what you will do if it is chosen (only you "
                                               "see it; it comes back with the answer)",
                      json_schema_extra={"maxLength": MAX_THEN})
    recommended: bool = Field(default=False, description="the option you recommend (one)")


class AddArgs(Args):
    targetType: Literal["goal", "outcome", "plan", "evidence"] = Field(
        description="the kind of item the comment is on")
    target: str = Field(max_length=REF_MAX, description="the item as owner/repo#N, or by the "
                        "key its title or body gives it (AC-12)")
    body: str = Field(default="", description=f"the comment, at most {MAX_BODY:,} characters",
                      json_schema_extra={"maxLength": MAX_BODY})
    to: list[ADDRESS] = Field(default_factory=list, description=(
        f'who it is for: emails, team:<key>, "agent", "me" (at most {MAX_ADDRESSED} people)'),
        json_schema_extra={"maxItems": MAX_ADDRESSED})
    cc: list[ADDRESS] = Field(default_factory=list, description="who should see it, like `to`",
                              json_schema_extra={"maxItems": MAX_ADDRESSED})
    parent: str | None = Field(default=None, max_length=ID_MAX,
                               description="id of a comment to reply to (its thread)")
    needsReply: bool = Field(default=False, description="a question: someone must answer")
    options: list[OptionArg] | None = Field(default=None, description=(
        f"a question's answers to choose from (at most {MAX_OPTIONS}); people can always "
        "answer in words"), json_schema_extra={"maxItems": MAX_OPTIONS})
    header: str | None = Field(default=None, description=(
        f'a question\'s title, a few words ("Token TTL"), at most {MAX_HEADER} characters'),
        json_schema_extra={"maxLength": MAX_HEADER})
    humanOnly: bool = Field(default=False, description="only a person may answer, not an agent")
    context: str | None = Field(default=None, description="what the person needs to know to "
                                "answer", json_schema_extra={"maxLength": MAX_CONTEXT})
    # a number out of range reaches the service, which names the question's own options
    option: Annotated[str, Field(min_length=1, max_length=200)] | Annotated[
        int, Field(json_schema_extra={"minimum": 1, "maximum": MAX_OPTIONS})] | None = Field(
        default=None, description=f"answer: option label or number (1 to {MAX_OPTIONS})")
    amend: bool = Field(default=False, description="change the answer you gave (with option)")
    confirmedWithPerson: bool = Field(default=False, description=(
        "an agent's answer that its person confirmed: recorded as theirs"))
    idempotencyKey: str | None = Field(default=None, min_length=1, max_length=200, description=(
        "any string; a retried call with the same key returns the first comment, never a "
        "second"))


@tool("add_comment", AddArgs, "Comment on a goal, outcome, plan or evidence; address people "
      "(to, cc), ask a question (needsReply or options), or reply in a thread (parent) to "
      "answer (option/body), pass it on (to) or change an answer (amend).",
      title="Comment on an item", output=outputs.CommentAdded,
      hints=Hints(read_only=False, destructive=False, idempotent=False, open_world=True))
async def add_comment(call: Call, args: AddArgs) -> dict[str, Any]:
    service = comments_for(call)
    item = await service.target(args.target, args.targetType, viewer_for(call))
    new = NewComment(body=args.body, to=args.to, cc=args.cc, parent=args.parent,
                     needs_reply=args.needsReply,
                     options=[o.model_dump() for o in args.options] if args.options else None,
                     header=args.header, human_only=args.humanOnly, context=args.context,
                     option=args.option, amend=args.amend, confirmed=args.confirmedWithPerson,
                     key=args.idempotencyKey)
    return await service.add(call.principal, item, new)


class ResolveArgs(Args):
    comment: str = Field(min_length=1, max_length=ID_MAX,
                         description="id of any comment in the thread")


@tool("resolve_comment", ResolveArgs, "Resolve a thread when it is done; for a question, only "
      "its asker or an editor can (it says the answer was used).", title="Resolve a thread",
      output=outputs.ThreadResult,
      hints=Hints(read_only=False, destructive=False, idempotent=True, open_world=True))
async def resolve_comment(call: Call, args: ResolveArgs) -> dict[str, Any]:
    viewer = viewer_for(call)
    row = await comments_for(call).resolve(call.principal, args.comment, viewer)
    hidden = await hidden_claims(call.services.store, [row], viewer.visible)
    return {"thread": thread_view(row, call.principal, hidden=hidden.get(row.id))}


class InboxArgs(Args):
    read: bool = Field(default=False, description="also return comments already read")
    # (cursors: any number that is none is 422 bad_cursor, in `_place`'s words)
    readBefore: int | None = Field(default=None, description="moreReadBefore from a last page "
                                   "(with read: true)",
                                   json_schema_extra={"minimum": 0, "maximum": MAX_ID})
    updatesBefore: int | None = Field(default=None, description="moreUpdatesBefore from a "
                                      "last page",
                                      json_schema_extra={"minimum": 0, "maximum": MAX_ID})
    since: str | None = Field(default=None, max_length=64,
                              description="stop updates at this time (ISO 8601)")
    wait: float = Field(default=0, ge=0, le=MAX_WAIT,
                        description=f"seconds (at most {MAX_WAIT}) to wait for something new")
    markRead: bool = Field(default=True, description=(
        "false: look without marking unread comments read (for a look whose unread comments "
        "are not shown to you, like the inbox prompt's)"))


@tool("list_inbox", InboxArgs, "Your inbox (`you`) and your agents' (`agents`): yourTurn, "
      "unread (shown once), waitingOnOthers; read comments with read: true; updates on your "
      "outcomes, 30 at a time; wait up to 50 seconds for something new.", title="Your inbox",
      hints=READS_INDEX, output=outputs.InboxResult)
async def list_inbox(call: Call, args: InboxArgs) -> dict[str, Any]:
    office = call.office
    if args.readBefore is not None and not args.read:
        raise InvalidArguments("readBefore pages the comments already read: pass read: true "
                               "with it")
    try:
        since = parse_time(args.since) if args.since else None
    except ValueError as exc:
        raise InvalidArguments(f"since: {args.since!r} is not an ISO 8601 time") from exc
    # the cursors are read before anything is looked at: one this app never gave is refused
    # before a look marks unread comments read (which it would then never show: they were
    # lost), and before a long poll waits
    cursors = call.services.cursors
    places = (_place(cursors, args.readBefore, "readBefore"),
              _place(cursors, args.updatesBefore, "updatesBefore"))
    sees = viewer_for(call).visible
    woken = await _wait_for_new(call, args.wait, sees) if args.wait > 0 else None
    if woken is not None and not call.is_agent:
        # polls of this viewer, with these arguments, that this wake-up ended: one look for
        # all (a poll of another viewer, office or wake-up never shares it). Not when the look
        # marked unread comments read: those are shown once, the others look again after it
        # (and share that look). An agent's answer is not list_inbox's alone (its `inbox`
        # field, its own mark): not shared
        key = (woken, office.org.lower(), call.principal, args.model_dump_json(exclude={"wait"}))
        mark = args.markRead and call.principal == inbox.Whose.of(office, call.principal).person
        shared: tuple[SharedAnswer, bool] = await call.services.notifier.together.once(
            key, lambda: _look_shared(call, args, since, sees, places),
            lambda r: not (mark and r.answer["you"]["unread"]))
        return shared[0].copy()  # the top level is each caller's own (its JSON made once)
    return await _look(call, args, since, sees, places)


async def _look(call: Call, args: InboxArgs, since: float | None, sees: Sees,
                places: tuple[int | None, int | None]) -> dict[str, Any]:
    store, office = call.services.store, call.office
    is_person = call.principal == inbox.Whose.of(office, call.principal).person
    read_before, updates_before = places
    # (the updates page read side by side with the boxes saved a builder's call about 0.5 ms
    # but slowed a thousand woken polls, each looking for itself, by about a tenth: two more
    # tasks a poll; bench.polls_profile --alone. For a look of its own, bench.inbox's, it
    # saved 1-3 % of an HTTP call, within this machine's noise: not done)
    computed = await inbox.compute(store, office, call.principal,
                                   mark_you=is_person and args.markRead,
                                   mark_agents=call.is_agent and args.markRead, sees=sees)
    result: dict[str, Any] = dict(computed.boxes)
    if call.is_agent:  # the `inbox` field shares this look: its unread went out just above
        call.inbox_ready[COMMENTS_INBOX] = _agent_share(
            computed, unread=[] if args.markRead else None)
    # a cursor is shown as the office may see it (bot.cursors: not a place among every
    # office's rows)
    cursors = call.services.cursors
    if args.read:  # (after the boxes: what they just marked read is on it)
        page = await inbox.read_page(store, office, call.principal, read_before, sees)
        result |= _shown(cursors, page, "read", "moreReadBefore")
    page = await inbox.updates_page(store, office, call.principal, updates_before, since, sees)
    result |= _shown(cursors, page, "updates", "moreUpdatesBefore")
    result["note"] = DATA_NOTE
    return result


async def _look_shared(call: Call, args: InboxArgs, since: float | None, sees: Sees,
                       places: tuple[int | None, int | None]) -> SharedAnswer:
    return SharedAnswer(await _look(call, args, since, sees, places))


def _place(cursors: Cursors, given: int | None, name: str) -> int | None:
    try:
        return None if given is None else cursors.place(given)
    except ValueError:
        raise InvalidArguments(f"{name}={given} is no cursor this app gave: pass back a "
                               f"page's more... value, or leave {name} out for the newest",
                               code="bad_cursor") from None


def _shown(cursors: Cursors, page: dict[str, Any], rows: str, more: str) -> dict[str, Any]:
    return {rows: [{**r, "cursor": cursors.shown(r["cursor"])} for r in page[rows]],
            more: None if page[more] is None else cursors.shown(page[more])}


async def _wait_for_new(call: Call, seconds: float, sees: Sees) -> Wake | None:
    """Sleep on the notifier until something new is the caller's (no polling): a person's own
    box, never their agents'; an agent's share of the agents' box and its own mail and chats.
    The wake-up that ended the sleep; None when something was new at once, or on timeout.

    The wait is registered before looking, so a delivery between the look and the sleep
    still wakes it; the wake-up resumes this call itself (no task of its own to go through
    first: one turn of the loop fewer for each of a thousand polls woken together)."""
    notifier, office = call.services.notifier, call.office
    watch = notifier.watch(inbox.wait_keys(office, call.principal), org=office.org)
    try:
        if await inbox.has_new(call.services.store, office, call.principal, sees) or (
                call.is_agent and await mails.has_unshown(call.services.store, call.principal,
                                                          org=office.org)):
            return None
        woken = await notifier.woken(watch, seconds)
    finally:
        notifier.unwatch(watch)
    await still_acting(call)  # slept: its token or office may be gone since
    return woken


class OutcomeArgs(Args):
    outcome: str = Field(max_length=REF_MAX,
                         description="owner/repo#N, or the outcome's key (AC-12)")


@tool("get_outcome", OutcomeArgs, "An outcome with its decisions and those of every goal above "
      "it (newest 10 each).", title="An outcome and its decisions", hints=READS_FORGE,
      output=outputs.OutcomeResult)
async def get_outcome(call: Call, args: OutcomeArgs) -> dict[str, Any]:
    service, viewer = comments_for(call), viewer_for(call)
    item = await service.target(args.outcome, "outcome", viewer, field="outcome")
    goals = []
    for parent in await work_tree.ancestors(service, item):  # from the forge, a read a level
        if parent.kind == "goal" and await viewer.sees_repo(parent.repo):
            goals.append({**await item_view(parent, viewer),
                          "decisions": await _decisions(call, viewer, parent.ref)})
    return {"outcome": await item_view(item, viewer),
            "decisions": await _decisions(call, viewer, item.ref),
            "goals": goals, "note": DATA_NOTE}


async def _decisions(call: Call, viewer: Viewer, scope: str) -> list[dict[str, Any]]:
    """The newest 10 decisions for `scope` that the viewer may see (one taken on a plan in a
    repository it cannot see counts for the outcome, but is not shown)."""
    found = await db.decisions(call.services.store, scope, limit=DECISIONS * 10)
    shown = await viewer.visible({t.item for t in found})
    return [decision_view(t, call.principal) for t in found if t.item in shown][:DECISIONS]


class TreeArgs(Args):
    goal: str = Field(max_length=REF_MAX, description="owner/repo#N, or the goal's key")


@tool("get_tree", TreeArgs, "A goal with the items under it and its decisions (newest 10).",
      title="A goal and the items under it", hints=READS_FORGE, output=outputs.TreeResult)
async def get_tree(call: Call, args: TreeArgs) -> dict[str, Any]:
    service, viewer = comments_for(call), viewer_for(call)
    goal = await service.target(args.goal, "goal", viewer, field="goal")

    async def tree(ref: str, depth: int) -> list[dict[str, Any]]:
        if depth > 5:
            return []
        children = await work_tree.children(service, ref)  # sub-issues, then `Part of`
        shown = await viewer.visible({c.ref for c in children})  # and nothing under the rest
        return [{**await item_view(c, viewer), "children": await tree(c.ref, depth + 1)}
                for c in children if c.ref in shown]

    return {"goal": await item_view(goal, viewer), "children": await tree(goal.ref, 0),
            "decisions": await _decisions(call, viewer, goal.ref), "note": DATA_NOTE}


COMMENTS_INBOX = "comments_inbox"


def _agent_share(computed: inbox.Computed, *,
                 unread: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    agents = computed.boxes["agents"]
    return {"yourTurn": [dict(v) for v in agents["yourTurn"]],
            "unread": agents["unread"] if unread is None else unread, **computed.counts}


@inbox_provider
async def comments_inbox(call: Call) -> dict[str, Any]:
    """An agent's share of its person's agents' inbox, and counts of the person's own."""
    ready = call.inbox_ready.pop(COMMENTS_INBOX, None)
    if ready is not None:
        return ready
    computed = await inbox.compute(call.services.store, call.office, call.principal,
                                   mark_you=False, mark_agents=True,
                                   sees=viewer_for(call).visible)
    return _agent_share(computed)
