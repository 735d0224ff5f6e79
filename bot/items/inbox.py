"""A person's two inboxes (seed: "Your inbox, and your agents'"), read from the index.

`you` holds what reached the person personally; `agents` what reached them through their
agents, shared by every agent of theirs. An agent without a person has only `agents`.
Unread comments are delivered once: whoever reads a box marks what it returned as read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bot.items.address import agents_of, owner_of
from bot.items.views import comment_view, iso, thread_view
from bot.office import Office
from bot.store import Store
from bot.store import comments as db

PAGE = 30


@dataclass(frozen=True)
class Whose:
    """The inbox owner seen from a viewer: the person (if any) and their agents."""

    viewer: str
    person: str | None
    agents: tuple[str, ...]

    @classmethod
    def of(cls, office: Office, viewer: str) -> Whose:
        owner = owner_of(office, viewer)
        if owner.startswith("human:"):
            return cls(viewer, owner, tuple(agents_of(office, owner)))
        return cls(viewer, None, (viewer,))

    @property
    def owner(self) -> str:
        return self.person or self.agents[0]

    @property
    def everyone(self) -> list[str]:
        return [*([self.person] if self.person else []), *self.agents]


async def _unread(store: Store, who: Whose, box: str, *, mark: bool) -> list[dict[str, Any]]:
    rows = await db.unread(store, who.owner, box)
    found = await db.comments_by_ids(store, [r["comment"] for r in rows])
    out = []
    for r in rows:
        c = found.get(r["comment"])
        if c is None:
            continue
        view = comment_view(c)
        if box == "agents":
            view["forAgent"] = r["principal"]
        out.append(view)
    if mark:
        await db.mark_read(store, [int(r["seq"]) for r in rows])
    return out


def _turns(threads: list[db.ThreadRow], targets: list[str], viewer: str,
           box: str) -> list[dict[str, Any]]:
    out = []
    for t in threads:
        mine = [p for p in t.state.waiting_on if p in targets]
        if not mine or not t.state.is_question:
            continue
        view = thread_view(t, viewer)
        if box == "agents":
            view["forAgent"] = mine[0]
        out.append(view)
    return out


def _waiting_on_others(threads: list[db.ThreadRow], askers: list[str], viewer: str,
                       box: str) -> list[dict[str, Any]]:
    out = []
    for t in threads:
        s = t.state
        if not s.is_question or s.answer is not None or s.asker not in askers:
            continue
        view = thread_view(t, viewer)
        if box == "agents":
            view["byAgent"] = s.asker
        out.append(view)
    return out


async def boxes(store: Store, office: Office, viewer: str, *, mark_you: bool,
                mark_agents: bool) -> dict[str, Any]:
    who = Whose.of(office, viewer)
    threads = await db.open_threads(store)
    you: dict[str, Any] = {"yourTurn": [], "unread": [], "waitingOnOthers": []}
    if who.person is not None:
        you = {"yourTurn": _turns(threads, [who.person], viewer, "you"),
               "unread": await _unread(store, who, "you", mark=mark_you),
               "waitingOnOthers": _waiting_on_others(threads, [who.person], viewer, "you")}
    agents = {"yourTurn": _turns(threads, list(who.agents), viewer, "agents"),
              "unread": await _unread(store, who, "agents", mark=mark_agents),
              "waitingOnOthers": _waiting_on_others(threads, list(who.agents), viewer,
                                                    "agents")}
    cards = [v for box in (you, agents) for key in ("yourTurn", "waitingOnOthers")
             for v in box[key]]
    kinds = await db.item_kinds(store, {str(v["item"]) for v in cards})
    for view in cards:  # answering needs targetType and target: give them with the card
        view.update(targetType=kinds.get(str(view["item"])), target=view["item"])
    return {"you": you, "agents": agents}


async def has_unread(store: Store, office: Office, viewer: str) -> bool:
    who = Whose.of(office, viewer)
    for box in ("you", "agents"):
        if await db.unread(store, who.owner, box):
            return True
    return False


async def read_page(store: Store, office: Office, viewer: str,
                    before: int | None) -> dict[str, Any]:
    who = Whose.of(office, viewer)
    rows = await db.read_page(store, who.owner, before, PAGE + 1)
    found = await db.comments_by_ids(store, [r["comment"] for r in rows[:PAGE]])
    read = []
    for r in rows[:PAGE]:
        c = found.get(r["comment"])
        if c is not None:
            read.append({**comment_view(c), "box": r["box"], "cursor": int(r["seq"])})
    more = int(rows[PAGE - 1]["seq"]) if len(rows) > PAGE else None
    return {"read": read, "moreReadBefore": more}


async def relevant_items(store: Store, office: Office, who: Whose) -> list[str]:
    """Outcomes the person (or an agent of theirs) created, holds, is assigned or asked about."""
    mine = set(who.everyone)
    logins = {login for p in mine if (login := _login(office, p))}
    refs = set(await db.questions_asked_on(store, list(mine)))
    for item in await db.all_items(store):
        if item.author in mine or item.claim in mine or logins & set(item.assignees):
            refs.add(item.ref)
    return sorted(refs)


def _login(office: Office, principal: str) -> str | None:
    kind, _, ident = principal.partition(":")
    who = office.human(ident) if kind == "human" else office.agent(ident)
    return who.login if who else None


async def updates_page(store: Store, office: Office, viewer: str, before: int | None,
                       since: float | None) -> dict[str, Any]:
    who = Whose.of(office, viewer)
    items = await relevant_items(store, office, who)
    rows = await db.updates_page(store, items, who.everyone, before, since, PAGE + 1)
    updates = [{"item": r["item"], "kind": r["kind"], "actor": r["actor"],
                "summary": r["summary"], "at": iso(r["at"]), "cursor": int(r["seq"])}
               for r in rows[:PAGE]]
    more = int(rows[PAGE - 1]["seq"]) if len(rows) > PAGE else None
    return {"updates": updates, "moreUpdatesBefore": more}


async def counts_for_person(store: Store, office: Office, viewer: str) -> dict[str, int]:
    """What waits in the person's own inbox, for their agent to mention (never to handle)."""
    who = Whose.of(office, viewer)
    if who.person is None:
        return {"unreadForYourPerson": 0, "waitingOnYourPerson": 0}
    unread = await db.unread(store, who.person, "you")
    threads = await db.open_threads(store)
    waiting = sum(1 for t in threads if t.state.is_question and who.person in t.state.waiting_on)
    return {"unreadForYourPerson": len(unread), "waitingOnYourPerson": waiting}
