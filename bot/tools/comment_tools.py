"""The comment tools (DESIGN §3.5): add_comment, resolve_comment, list_inbox, get_outcome,
get_tree; and the `inbox` every agent's tool result carries."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from bot.errors import InvalidArguments
from bot.items import inbox
from bot.items.service import MAX_BODY, Comments, NewComment
from bot.items.views import DATA_NOTE, decision_view, parse_time, thread_view
from bot.store import comments as db
from bot.store import mails
from bot.tools.registry import Args, Call, inbox_provider, tool
from labels.states import MailState

MAX_WAIT = 50


def comments_for(call: Call) -> Comments:
    return Comments(call.services, call.forge, call.office)


class OptionArg(BaseModel):
    model_config = ConfigDict(extra="forbid")
    label: str = Field(description="the button: 1 to 5 words, at most 60 characters")
    description: str = Field(default="", description="the trade-off, in a sentence")
    then: str = Field(default="", description="what you will do if it is chosen (only you "
                                               "see it; it comes back with the answer)")
    recommended: bool = False


class AddArgs(Args):
    targetType: Literal["goal", "outcome", "plan", "evidence"]
    target: str = Field(description="the item as owner/repo#N")
    body: str = Field(default="", description=f"at most {MAX_BODY:,} characters")
    to: list[str] = Field(default_factory=list, description='emails, team:<key>, "agent", "me"')
    cc: list[str] = Field(default_factory=list)
    parent: str | None = Field(default=None, description="id of a comment to reply to")
    needsReply: bool = False
    options: list[OptionArg] | None = None
    header: str | None = None
    humanOnly: bool = False
    context: str | None = None
    option: str | int | None = Field(default=None, description="answer: option label or number")
    amend: bool = False
    confirmedWithPerson: bool = False


@tool("add_comment", AddArgs, "Comment on a goal, outcome, plan or evidence; address people "
      "(to, cc), ask a question (needsReply or options), or reply in a thread (parent) to "
      "answer (option/body), pass it on (to) or change an answer (amend).")
async def add_comment(call: Call, args: AddArgs) -> dict[str, Any]:
    service = comments_for(call)
    item = await service.target(args.target, args.targetType)
    new = NewComment(body=args.body, to=args.to, cc=args.cc, parent=args.parent,
                     needs_reply=args.needsReply,
                     options=[o.model_dump() for o in args.options] if args.options else None,
                     header=args.header, human_only=args.humanOnly, context=args.context,
                     option=args.option, amend=args.amend, confirmed=args.confirmedWithPerson)
    return await service.add(call.principal, item, new)


class ResolveArgs(Args):
    comment: str = Field(min_length=1, description="id of any comment in the thread")


@tool("resolve_comment", ResolveArgs, "Resolve a thread when it is done; for a question, only "
      "its asker or an editor can (it says the answer was used).")
async def resolve_comment(call: Call, args: ResolveArgs) -> dict[str, Any]:
    row = await comments_for(call).resolve(call.principal, args.comment)
    return {"thread": thread_view(row, call.principal)}


class InboxArgs(Args):
    read: bool = Field(default=False, description="also return comments already read")
    readBefore: int | None = Field(default=None, description="moreReadBefore from a last page")
    updatesBefore: int | None = Field(default=None,
                                      description="moreUpdatesBefore from a last page")
    since: str | None = Field(default=None, description="stop updates at this time (ISO 8601)")
    wait: float = Field(default=0, ge=0, le=MAX_WAIT,
                        description=f"seconds (at most {MAX_WAIT}) to wait for something new")


@tool("list_inbox", InboxArgs, "Your inbox (`you`) and your agents' (`agents`): yourTurn, "
      "unread (shown once), waitingOnOthers; read comments with read: true; updates on your "
      "outcomes, 30 at a time; wait up to 50 seconds for something new.")
async def list_inbox(call: Call, args: InboxArgs) -> dict[str, Any]:
    store, office = call.services.store, call.office
    try:
        since = parse_time(args.since) if args.since else None
    except ValueError as exc:
        raise InvalidArguments(f"since: {args.since!r} is not an ISO 8601 time") from exc
    if args.wait > 0:
        await _wait_for_new(call, args.wait)
    is_person = call.principal == inbox.Whose.of(office, call.principal).person
    computed = await inbox.compute(store, office, call.principal, mark_you=is_person,
                                   mark_agents=call.is_agent)
    result: dict[str, Any] = dict(computed.boxes)
    if call.is_agent:  # the `inbox` field shares this look: its unread went out just above
        call.inbox_ready[COMMENTS_INBOX] = _agent_share(computed, unread=[])
    if args.read:
        result |= await inbox.read_page(store, office, call.principal, args.readBefore)
    result |= await inbox.updates_page(store, office, call.principal, args.updatesBefore, since)
    result["note"] = DATA_NOTE
    return result


async def _wait_for_new(call: Call, seconds: float) -> None:
    """Sleep on the notifier until something is delivered to this inbox (no polling).

    The waiter is registered before looking, so a delivery between the look and the sleep
    still wakes it."""
    owner = inbox.Whose.of(call.office, call.principal).owner
    waiter = asyncio.create_task(
        call.services.notifier.wait_any({owner, call.principal}, seconds))
    await asyncio.sleep(0)
    if await inbox.has_unread(call.services.store, call.office, call.principal) or (
            call.is_agent and await mails.list_mails(
                call.services.store, to=call.principal, state=MailState.NEW.value, limit=1)):
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiter
        return
    await waiter


class OutcomeArgs(Args):
    outcome: str = Field(description="owner/repo#N")


@tool("get_outcome", OutcomeArgs, "An outcome with its decisions and those of every goal above "
      "it (newest 10 each).")
async def get_outcome(call: Call, args: OutcomeArgs) -> dict[str, Any]:
    service = comments_for(call)
    item = await service.target(args.outcome, "outcome")
    store = call.services.store
    goals = []
    seen = {item.ref}
    ref = item.parent
    while ref and ref not in seen:  # walk up; a loop of "Part of" links stops here
        seen.add(ref)
        parent = await service.parent_item(ref)
        if parent is None:
            break
        if parent.kind == "goal":
            goals.append({**parent.as_json(), "decisions": [
                decision_view(t, call.principal) for t in await db.decisions(store, parent.ref)]})
        ref = parent.parent
    return {"outcome": item.as_json(),
            "decisions": [decision_view(t, call.principal)
                          for t in await db.decisions(store, item.ref)],
            "goals": goals, "note": DATA_NOTE}


class TreeArgs(Args):
    goal: str = Field(description="owner/repo#N")


@tool("get_tree", TreeArgs, "A goal with the items under it and its decisions (newest 10).")
async def get_tree(call: Call, args: TreeArgs) -> dict[str, Any]:
    service = comments_for(call)
    goal = await service.target(args.goal, "goal")
    store = call.services.store

    async def tree(ref: str, depth: int) -> list[dict[str, Any]]:
        if depth > 5:
            return []
        return [{**c.as_json(), "children": await tree(c.ref, depth + 1)}
                for c in await db.children(store, ref)]

    return {"goal": goal.as_json(), "children": await tree(goal.ref, 0),
            "decisions": [decision_view(t, call.principal)
                          for t in await db.decisions(store, goal.ref)],
            "note": DATA_NOTE}


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
                                   mark_you=False, mark_agents=True)
    return _agent_share(computed)
