"""The console's pages: the inbox (the card stack), Mail, an agent's desk, the ledger.

Every read is a tool call of the visitor (`list_inbox`, `mail_get`) or an index read filtered
by the shared visibility check (`bot.console.queries`); every write is a tool call
(`bot.console.actions`). Nothing here decides who may do what.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from aiohttp import web

from bot.console import live, queries, sessions
from bot.console.frame import frame, signed_in, tool, unread_beside
from bot.console.render import page
from bot.console.visitor import Visitor, looking_itself
from bot.digits import whole
from bot.email.message import read_meta
from bot.errors import InvalidArguments, NotFoundError
from bot.items.views import hidden_claims, parse_time, thread_view
from bot.office.config import Agent
from bot.office.visibility import viewer_for
from bot.store import comments as db
from bot.store import mails
from bot.store.mails import MailRecord
from bot.tools.mail_tools import find_mail

STATES = ("new", "working", "replied", "closed", "held", "quiet")


def _verdicts(found: Iterable[MailRecord]) -> dict[str, dict[str, Any]]:
    """The SPF, DKIM and DMARC verdicts of each mail from outside (email) in `found`, by mail
    id, as its signed body records them (bot.email.message)."""
    out: dict[str, dict[str, Any]] = {}
    for mail in found:
        if mail.from_principal.startswith("email:"):
            meta = read_meta(mail.body)
            if meta is not None:
                out[mail.mail_id] = meta.verdicts
    return out


def _withdrawn(v: Visitor, found: Iterable[MailRecord]) -> set[str]:
    """The mails in `found` signed with a key the operator has since revoked: not verified,
    but not changed either; their badge says the key was withdrawn."""
    keys = v.services.keyring
    return {mail.mail_id for mail in found if keys.revoked(mail.key_id)}


def _stack(cards: list[dict[str, Any]], deferred: dict[str, float]) -> list[dict[str, Any]]:
    """`yourTurn` as the card stack: in the inbox's order, the cards set aside (Defer) last,
    in the order they were set aside, so they come back at the end."""
    now = [dict(c, deferred=False) for c in cards if c["thread"] not in deferred]
    later = sorted((dict(c, deferred=True) for c in cards if c["thread"] in deferred),
                   key=lambda c: deferred[c["thread"]])
    return now + later


async def _answered(v: Visitor) -> list[dict[str, Any]]:
    store = v.services.store
    viewer = viewer_for(v.call)
    rows = await queries.answered_by(store, viewer, v.principal)
    kinds = await db.item_kinds(store, {t.item for t in rows})
    hidden = await hidden_claims(store, rows, viewer.visible)
    return [dict(thread_view(t, v.principal, hidden=hidden.get(t.id)),
                 targetType=kinds.get(t.item), target=t.item) for t in rows]


def _not_yours(box: dict[str, Any], principal: str) -> dict[str, Any]:
    """The agents' box without their questions that wait on the person: those are the
    person's own cards already (Your turn), not listed twice."""
    me = {principal, principal.removeprefix("human:")}
    return {**box, "waitingOnOthers": [t for t in box.get("waitingOnOthers", [])
                                       if not me & set(t.get("waitingOn") or [])]}


async def inbox_context(request: web.Request, v: Visitor) -> dict[str, Any]:
    stamp = await live.delivery_stamp(v)  # before the look: a later delivery re-fetches
    # the person looks: what is unread is marked read (not when another site sent them here)
    look = await tool(v, "list_inbox", read=True, markRead=looking_itself(request, v))
    deferred = await sessions.deferred(v.services.store, v.principal, org=v.call.office.org)
    you = look["you"]
    cards = {c["thread"] for c in you["yourTurn"]}
    for gone in set(deferred) - cards:  # no longer waiting on them: set aside no more
        await sessions.undefer(v.services.store, v.principal, gone, org=v.call.office.org)
    stack = _stack(you["yourTurn"], deferred)
    answered = [t for t in await _answered(v) if t["thread"] not in cards]
    return {"stack": stack, "unread": unread_beside(you), "waiting": you["waitingOnOthers"],
            "read": look.get("read", []), "updates": look.get("updates", []),
            "agents_box": _not_yours(look["agents"], v.principal), "answered": answered,
            "version": await live.version(v, look, stamp),
            "badge_now": len(you["yourTurn"])}


@signed_in
async def inbox_page(request: web.Request, v: Visitor) -> web.StreamResponse:
    context = await inbox_context(request, v)
    if request.query.get("part") == "live":
        return page("inbox_live.html", {**context, "csrf": v.csrf, "v": v,
                                        "forge_web": v.services.settings.web_url})
    return page("inbox.html", {**await frame(request, v, "inbox",
                                             badge_count=context["badge_now"]), **context})


def _agent_filter(v: Visitor, slug: str | None) -> Agent | None:
    if not slug:
        return None
    agent = v.call.office.agent(slug)
    if agent is None:
        known = ", ".join(a.slug for a in v.call.office.agents)
        raise InvalidArguments(f"agent: no agent {slug!r} in this office; known: {known}")
    return agent


def _senders(v: Visitor) -> tuple[list[Agent], str | None]:
    """The agents the visitor may mail, and why not, when they may mail none."""
    mailer = v.call.mailer
    allowed, reasons = [], []
    for agent in v.call.office.agents:
        why = mailer.send_refusal(v.principal, agent)
        if why is None:
            allowed.append(agent)
        else:
            reasons.append(why)
    return allowed, (None if allowed else (reasons[0] if reasons else
                                           "this office has no agents to write to"))


@signed_in
async def mail_page(request: web.Request, v: Visitor) -> web.StreamResponse:
    q = request.query
    state = q.get("state") or None
    if state is not None and state not in STATES:
        raise InvalidArguments(f"state: {state!r} is not one of {', '.join(STATES)}")
    agent = _agent_filter(v, q.get("agent"))
    text = (q.get("q") or "").strip()[:200] or None
    found = await queries.find_mails(
        v.services.store, org=v.call.office.org, state=None if state is None else (
            mails.QUIET if state == "quiet" else f"mail:{state}"),
        agent=agent.principal if agent else None, text=text)
    threads = await queries.threads(v.services.store, viewer_for(v.call), found)
    allowed, refusal = _senders(v)
    reply_to = await _reply_to(v, q.get("reply"))
    return page("mail.html", {
        **await frame(request, v, "mail"), "threads": threads,
        "verdicts": _verdicts(m for t in threads for m in t.mails),
        "withdrawn": _withdrawn(v, (m for t in threads for m in t.mails if m.tampered)),
        "filters": {"state": state or "", "agent": agent.slug if agent else "", "q": text or ""},
        "states": STATES, "may_send": allowed, "refusal": refusal, "reply_to": reply_to,
        "sent": q.get("sent")})


async def _reply_to(v: Visitor, ref: str | None) -> MailRecord | None:
    if not ref:
        return None
    try:  # as mail_get reads it: a ref from before a rename names the mail too
        return await find_mail(v.call, ref)
    except NotFoundError:
        return None


@signed_in
async def thread_page(request: web.Request, v: Visitor) -> web.StreamResponse:
    thread_id = request.match_info["thread"]
    viewer = viewer_for(v.call)
    members = queries.in_order([m for m in await mails.list_mails(v.services.store,
                                                                   org=v.call.office.org,
                                                                   thread=thread_id)
                                if viewer.sees_mail(m)])
    if not members:
        raise NotFoundError(f"no mail thread {thread_id!r} of yours: pick one on the Mail page")
    messages = []
    for mail in members:  # mail_get verifies each header as it reads it
        got = await tool(v, "mail_get", mail=mail.ref)
        messages.append({"mail": got["mail"], "verified": got["verified"],
                         "comments": got["comments"]})
    allowed, refusal = _senders(v)
    return page("thread.html", {**await frame(request, v, "mail"), "messages": messages,
                                "verdicts": _verdicts(members),
                                "withdrawn": _withdrawn(v, members),
                                "thread_id": thread_id, "may_send": allowed,
                                "refusal": refusal, "last": members[-1]})


@signed_in
async def agents_page(request: web.Request, v: Visitor) -> web.StreamResponse:
    context = await frame(request, v, "agents")
    return page("agents.html", context)


async def _desk_agent(v: Visitor, slug: str) -> Agent:
    agent = v.call.office.agent(slug)
    # an agent whose vault the person cannot see is not found, as the forge would say
    if agent is None or not await viewer_for(v.call).sees_repo(v.call.office.vault_of(agent)):
        raise NotFoundError(f"no agent {slug!r} whose desk you may see; the agents you may see "
                            "are in the sidebar")
    return agent


async def _runs(v: Visitor, agent: Agent) -> list[dict[str, Any]]:
    """The agent's runs from the ledger (queued or refused, and how each finished), newest
    first, as far as the visitor may see them."""
    entries, _ = await queries.ledger_page(
        v.services.store, viewer_for(v.call), event=None, actor=None, since=None, until=None,
        about=agent.principal, limit=200)
    finished = {e.data.get("run"): e for e in entries if e.event == "run.finished"}
    runs = []
    for e in entries:
        if e.event == "run.queued":
            end = finished.get(e.data.get("run"))
            runs.append({"run": e.data.get("run"), "kind": e.data.get("kind"),
                         "subject": e.subject, "at": e.time,
                         "state": ("queued" if end is None else
                                   "done" if end.data.get("exit") == 0
                                   and not end.data.get("timed_out") else "failed"),
                         "finished": end.data if end else None})
        elif e.event == "run.refused":
            runs.append({"run": None, "kind": e.data.get("kind"), "subject": e.subject,
                         "at": e.time, "state": "refused", "reason": e.data.get("reason"),
                         "finished": None})
    return runs


async def desk_chat_context(v: Visitor, agent: Agent) -> dict[str, Any]:
    chats = await queries.chats_with(v.services.store, viewer_for(v.call), v.principal,
                                     agent.principal)
    return {"agent": agent, "chats": chats, "csrf": v.csrf}


@signed_in
async def desk_page(request: web.Request, v: Visitor) -> web.StreamResponse:
    agent = await _desk_agent(v, request.match_info["slug"])
    chat = await desk_chat_context(v, agent)
    if request.query.get("part") == "chat":
        return page("desk_chat.html", chat)
    viewer = viewer_for(v.call)
    by_state: dict[str, list[MailRecord]] = {s: [] for s in STATES}
    for mail in await queries.agent_mails(v.services.store, viewer, agent.principal):
        by_state[mail.state.removeprefix("mail:")].append(mail)
    entries, _ = await queries.ledger_page(
        v.services.store, viewer, event=None, actor=None, since=None, until=None,
        about=agent.principal, limit=30)
    stamp = await live.delivery_stamp(v)
    look = await tool(v, "list_inbox", markRead=False)
    return page("desk.html", {
        **await frame(request, v, "desk:" + agent.slug), **chat, "by_state": by_state,
        "runs": await _runs(v, agent), "entries": entries,
        "vault": v.call.office.vault_of(agent), "version": await live.version(v, look, stamp)})


def _time_arg(name: str, value: str | None) -> float | None:
    if not value:
        return None
    try:
        return parse_time(value)
    except ValueError as exc:
        raise InvalidArguments(f"{name}: {value!r} is not a time: give 2026-12-02 or "
                               "2026-12-02T12:00") from exc


@signed_in
async def ledger_page(request: web.Request, v: Visitor) -> web.StreamResponse:
    q = request.query
    kinds = await queries.ledger_kinds(v.services.store)
    event = q.get("kind") or None
    if event is not None and event not in kinds:
        raise InvalidArguments(f"kind: {event!r} is not a ledger event; one of "
                               f"{', '.join(kinds)}")
    actor = (q.get("principal") or "").strip() or None
    since, until = _time_arg("from", q.get("from")), _time_arg("until", q.get("until"))
    before = q.get("before")
    seq = None if before is None else whole(before)
    if before is not None and seq is None:
        raise InvalidArguments(f"before: {before[:40]!r} is not an entry's number; follow the "
                               "Older entries link, or leave it out for the newest")
    entries, more = await queries.ledger_page(
        v.services.store, viewer_for(v.call), event=event, actor=actor, since=since,
        until=until, before=seq)
    filters = {"kind": event or "", "principal": actor or "", "from": q.get("from", ""),
               "until": q.get("until", "")}
    return page("ledger.html", {
        **await frame(request, v, "ledger"), "entries": entries, "more": more,
        "kinds": kinds, "filters": filters, "chain": await queries.chain_state(v.services.store,
                                                                    v.call.office.org),
        "principals": _principals(v)})


def _principals(v: Visitor) -> list[str]:
    office = v.call.office
    return ["office", *(h.principal for h in office.humans), *(a.principal for a in office.agents)]
