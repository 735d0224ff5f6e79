"""A person's two inboxes (seed: "Your inbox, and your agents'"), read from the index.

`you` holds what reached the person personally; `agents` what reached them through their
agents, shared by every agent of theirs. An agent without a person has only `agents`.
Unread comments are delivered once: the person reading `you` marks it read; each agent has
its own mark on `agents`, so every agent sees each item once. The person sees `agents` as
history ("Your agents are handling"): reading it marks nothing, and it never wakes them.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from bot.items.address import agents_of, owner_of
from bot.items.views import (
    Sees,
    comment_view,
    hidden_authors,
    hidden_claims,
    iso,
    thread_view,
)
from bot.office.config import Office
from bot.store import Store
from bot.store import comments as db

PAGE = 30
HISTORY = "Your agents are handling"
_VIEWS_CACHED = 16384
# thread_view of the row objects the store's thread cache hands out, for the asker and for
# everyone else, with the claim holder it leaves out (the only ways a view depends on its
# viewer); a row rewritten is a new object.
_views: OrderedDict[tuple[str, bool, str | None], tuple[db.ThreadRow, dict[str, Any]]] = \
    OrderedDict()
# `Sees` (bot.items.views): which of these items the viewer may see: what it may not see is
# neither shown nor marked read. Every read of a box takes it, no default: a read path that
# forgot it would show everything.


def _thread_view(t: db.ThreadRow, viewer: str, hidden: dict[str, str]) -> dict[str, Any]:
    """A fresh copy of `thread_view(t, viewer)` (its top level is the caller's to extend), less
    the claim holder `hidden` has for it (`views.hidden_claims`)."""
    key = (t.id, viewer == t.state.asker, hidden.get(t.id))
    hit = _views.get(key)
    if hit is not None and hit[0] is t:
        _views.move_to_end(key)
        return dict(hit[1])
    view = thread_view(t, viewer, hidden=hidden.get(t.id))
    _views[key] = (t, view)
    if len(_views) > _VIEWS_CACHED:
        _views.popitem(last=False)
    return dict(view)


@dataclass(frozen=True)
class Whose:
    """The inbox owner seen from a viewer: the person (if any) and their agents."""

    viewer: str
    person: str | None
    agents: tuple[str, ...]
    org: str  # the office they are all of

    @classmethod
    def of(cls, office: Office, viewer: str) -> Whose:
        owner = owner_of(office, viewer)
        if owner.startswith("human:"):
            return cls(viewer, owner, tuple(agents_of(office, owner)), office.org.lower())
        return cls(viewer, None, (viewer,), office.org.lower())

    @property
    def owner(self) -> str:
        return self.person or self.agents[0]

    @property
    def everyone(self) -> list[str]:
        return [*([self.person] if self.person else []), *self.agents]


async def _unread(store: Store, who: Whose, *, mark_you: bool, mark_agents: bool,
                  sees: Sees) -> dict[str, tuple[list[dict[str, Any]], int]]:
    """Each box's unread comments (views, and how many), oldest first.

    `you`: the person's own, marked read (`mark_you`) only by the person reading them.
    `agents`, for an agent: what it has not been shown of the shared box (each agent has its
    own mark: a sibling's call never consumes its share), marked by `mark_agents`; for the
    person: history, what each comment's agent has not picked up yet, never marked."""
    is_agent = who.viewer != who.person
    org = who.org
    you_rows, agent_rows = await db.unread_boxes(  # one read for both
        store, who.owner, you=who.person is not None, agent=who.viewer if is_agent else None,
        agents=list(who.agents), org=org)
    found = await db.comments_by_ids(store, [r["comment"] for r in [*you_rows, *agent_rows]])
    shown = None if sees is None else await sees({c.item for c in found.values()})

    def hidden(r: Any) -> bool:  # on an item the viewer may not see: not shown
        c = found.get(r["comment"])
        return shown is not None and c is not None and c.item not in shown

    # (by "agent", an answer of a claim holder the viewer may not be told of)
    unnamed = await hidden_authors(store, [c for c in found.values()
                                           if shown is None or c.item in shown], sees)
    out: dict[str, tuple[list[dict[str, Any]], int]] = {}
    for box, rows in (("you", you_rows), ("agents", agent_rows)):
        views = []
        for r in rows:
            c = found.get(r["comment"])
            if c is None or hidden(r):
                continue
            view = comment_view(c, hidden=unnamed.get(c.thread))
            if box == "agents":
                view["forAgent"] = r["principal"]
            views.append(view)
        out[box] = (views, len(views))
    if mark_you and not is_agent:  # what may not be shown yet stays unread
        await db.mark_read(store, [(int(r["seq"]), str(r["comment"])) for r in you_rows
                                   if not hidden(r)])
    if mark_agents and is_agent:  # the agent has been through all of it: what it may not
        await db.mark_seen(store, who.owner, who.viewer,  # see is not its to see
                           [(int(r["seq"]), str(r["comment"])) for r in agent_rows], org=org)
    return out


async def has_new(store: Store, office: Office, viewer: str, sees: Sees) -> bool:
    """Whether something unread is the viewer's own to see now: a person's own box, an agent's
    share of the agents' box (seed: "returns as soon as something new is yours")."""
    who = Whose.of(office, viewer)
    agent = who.viewer != who.person
    if not agent:
        rows = await db.unread_in(store, who.owner, ["you"], org=who.org)
    else:
        rows = await db.unseen_by(store, who.owner, who.viewer, org=who.org)
    if not rows or (sees is None and not agent):
        return bool(rows)
    found = await db.comments_by_ids(store, [r["comment"] for r in rows])
    # a comment past the loop guard is the agent's to see on its next look, not news that
    # ends a wait (bot.items.loop_guard)
    items = {c.item for c in found.values() if not (agent and c.data.get("loopGuard"))}
    return bool(items) and (sees is None or bool(await sees(items)))


def _turns(page: db.QuestionPage, targets: list[str], viewer: str, box: str,
           hidden: dict[str, str]) -> Cards:
    """The cards of questions waiting on `targets`: the page the store read (newest first,
    visibility and the page cut in its query; see `_questions`), checked here again."""
    out: list[dict[str, Any]] = []
    total = page.total
    for t in page.threads:
        s = t.state
        mine = [p for p in s.waiting_on if p in targets]
        # the answer to a sibling agent's question: the viewer may act on it, but acting on
        # it and resolving it is the asker's (seed: "`askedBy` names it"); it carries it as
        # history until it replies in the thread (passing it on) or the asker resolves it
        sibling = viewer in targets and viewer not in mine and s.asker in mine
        if not mine or not s.is_question or (sibling and viewer in s.replied_since):
            total -= 1  # (the query left these out: a safety net, never taken)
            continue
        view = _thread_view(t, viewer, hidden)
        # a question waiting on your answer, or a reply to one you asked: read it, act on
        # it, resolve it (seed: "questions waiting on you, and replies to yours")
        # (returned: asked only of people who have left, it is its asker's again: `why`)
        view["turn"] = ("returned" if s.returned else "replied") if s.asker in mine \
            else "answer"
        if box == "agents":
            view["forAgent"] = mine[0]
        if sibling:
            view.update(asHistory=True, note=(
                f"{s.asker} asked this: it acts on the answer and resolves the thread. Use "
                "it where it bears on your own work; reply in the thread to set it down"))
        out.append(view)
    return Cards(out[:PAGE], max(total, len(out[:PAGE])))


def _waiting_on_others(page: db.QuestionPage, askers: list[str], viewer: str,
                       box: str, hidden: dict[str, str]) -> Cards:
    out: list[dict[str, Any]] = []
    total = page.total
    for t in page.threads:
        s = t.state
        if not s.is_question or s.answer is not None or s.asker not in askers:
            total -= 1  # (as in _turns: never taken)
            continue
        view = _thread_view(t, viewer, hidden)
        if box == "agents":
            view["byAgent"] = s.asker
        out.append(view)
    return Cards(out[:PAGE], max(total, len(out[:PAGE])))


async def _questions(store: Store, who: Whose, sees: Sees) -> dict[str, db.QuestionPage]:
    """The four question lists of the viewer's boxes, each its newest PAGE threads and its
    count, read in SQL with the visibility rule in the query: the repositories the viewer may
    see (asked of `sees` once per repository its open questions are on) are a condition of
    the query, so a hidden repository's threads never leave the database. What comes back is
    checked with `sees` again (a safety net: a thread shown is on an item the viewer sees)."""
    person = [who.person] if who.person else []
    agents = list(who.agents)
    lists = {"you_turn": (db.WAITING_ON, person), "you_waiting": (db.ASKED_BY, person),
             "agents_turn": (db.WAITING_ON, agents), "agents_waiting": (db.ASKED_BY, agents)}
    repos: list[str] | None = None
    if sees is not None:  # one item of each repository stands for it (visibility is per
        # repository: bot.office.visibility.Viewer.visible)
        found = await db.question_repos(store, who.everyone, org=who.org)
        shown = await sees({f"{repo}#1" for repo in found})
        repos = [repo for repo in found if f"{repo}#1" in shown]
    pages = await db.inbox_questions(store, lists, viewer=who.viewer, repos=repos,
                                     org=who.org, limit=PAGE)
    if sees is None:
        return pages
    items = {t.item for page in pages.values() for t in page.threads}
    if not items:
        return pages
    visible = await sees(items)
    if visible >= items:
        return pages
    return {name: db.QuestionPage([t for t in page.threads if t.item in visible],
                                  page.total - sum(t.item not in visible for t in page.threads),
                                  page.kinds)
            for name, page in pages.items()}


@dataclass(frozen=True)
class Cards:
    """The newest PAGE cards of a list (an inbox answer is a page, not a megabyte: with a
    thousand open questions it was 0.5-1.5 MB, bench.inbox), and how many there are."""

    shown: list[dict[str, Any]]
    total: int

    def into(self, box: dict[str, Any], key: str) -> None:
        box[key] = self.shown
        if self.total > len(self.shown):  # the rest come up as these are answered
            box["more" + key[0].upper() + key[1:]] = self.total - len(self.shown)


def wake_key(owner: str, box: str) -> str:
    """What a delivery to `owner`'s `box` wakes in the notifier."""
    return f"{box}:{owner}"


def wait_keys(office: Office, viewer: str) -> set[str]:
    """What a long poll of `viewer` waits on: a person on their own box only (never on their
    agents'); an agent on the agents' box it shares and on what is addressed to it (its mail
    and chats wake its principal)."""
    who = Whose.of(office, viewer)
    if viewer == who.person:
        return {wake_key(who.owner, "you")}
    return {viewer, wake_key(who.owner, "agents")}


@dataclass(frozen=True)
class Computed:
    """One look at a viewer's inboxes: both boxes, and the counts of the person's own."""

    boxes: dict[str, Any]
    person_unread: int
    person_waiting: int

    @property
    def counts(self) -> dict[str, int]:
        return {"unreadForYourPerson": self.person_unread,
                "waitingOnYourPerson": self.person_waiting}


async def compute(store: Store, office: Office, viewer: str, *, mark_you: bool,
                  mark_agents: bool, sees: Sees) -> Computed:
    """The boxes (`you` and `agents`) and the person's counts, from one read of the open questions'
    pages (`_questions`)."""
    who = Whose.of(office, viewer)
    pages, unread = await asyncio.gather(  # two reads of their own: side by side
        _questions(store, who, sees),
        _unread(store, who, mark_you=mark_you, mark_agents=mark_agents, sees=sees))
    hidden = await hidden_claims(store, [t for p in pages.values() for t in p.threads], sees)
    you: dict[str, Any] = {"yourTurn": [], "unread": [], "waitingOnOthers": []}
    person_unread = person_waiting = 0
    if who.person is not None:
        turns = _turns(pages["you_turn"], [who.person], viewer, "you", hidden)
        you = {"yourTurn": [], "unread": unread["you"][0], "waitingOnOthers": []}
        turns.into(you, "yourTurn")
        _waiting_on_others(pages["you_waiting"], [who.person], viewer, "you", hidden).into(
            you, "waitingOnOthers")
        person_unread, person_waiting = unread["you"][1], turns.total
    agents: dict[str, Any] = {"yourTurn": [], "unread": unread["agents"][0],
                              "waitingOnOthers": []}
    _turns(pages["agents_turn"], list(who.agents), viewer, "agents", hidden).into(
        agents, "yourTurn")
    _waiting_on_others(pages["agents_waiting"], list(who.agents), viewer, "agents",
                       hidden).into(agents, "waitingOnOthers")
    if viewer == who.person:  # the person sees it as history, never as a notification
        agents = {"title": HISTORY, **agents}
    cards = [v for box in (you, agents) for key in ("yourTurn", "waitingOnOthers")
             for v in box[key]]
    kinds = {item: kind for page in pages.values() for item, kind in page.kinds.items()}
    for view in cards:  # answering needs targetType and target: give them with the card
        view.update(targetType=kinds.get(str(view["item"])), target=view["item"])
    return Computed({"you": you, "agents": agents}, person_unread, person_waiting)


async def read_page(store: Store, office: Office, viewer: str,
                    before: int | None, sees: Sees) -> dict[str, Any]:
    who = Whose.of(office, viewer)
    if viewer == who.person:  # their own box
        rows = await db.read_page(store, who.owner, before, PAGE + 1, org=who.org)
    else:  # what this agent has been shown of the agents' box
        rows = await db.seen_page(store, who.owner, viewer, before, PAGE + 1, org=who.org)
    found = await db.comments_by_ids(store, [r["comment"] for r in rows[:PAGE]])
    shown = None if sees is None else await sees({c.item for c in found.values()})
    unnamed = await hidden_authors(store, [c for c in found.values()
                                           if shown is None or c.item in shown], sees)
    read = []
    for r in rows[:PAGE]:
        c = found.get(r["comment"])
        if c is not None and (shown is None or c.item in shown):
            read.append({**comment_view(c, hidden=unnamed.get(c.thread)), "box": r["box"],
                         "cursor": int(r["seq"])})
    more = int(rows[PAGE - 1]["seq"]) if len(rows) > PAGE else None
    return {"read": read, "moreReadBefore": more}


async def relevant_items(store: Store, office: Office, who: Whose) -> list[str]:
    """Outcomes the person (or an agent of theirs) created, holds, is assigned or asked about."""
    return await db.relevant_items(store, who.everyone, logins_of(office, who), org=who.org)


def logins_of(office: Office, who: Whose) -> list[str]:
    return sorted({login for p in who.everyone if (login := _login(office, p))})


def _login(office: Office, principal: str) -> str | None:
    kind, _, ident = principal.partition(":")
    who = office.human(ident) if kind == "human" else office.agent(ident)
    return who.login if who else None


UPDATE_ROUNDS = 4  # reads at most for one page of updates, past those the viewer may not see


def update_names(row: Any) -> set[str]:
    """The items an update names: its outcome, and the plan or evidence it tells of (its ref
    and title are in the summary), each by the name its repository has now."""
    about = row["about"]
    return {str(row["item"]), *([str(about)] if about else [])}


# The most repositories one page asks `sees` about by repository (`_updates_by_repository`):
# the updates the rounds read at most, each naming one or two. Past it the page is read in
# rounds, asking of the items of what they read.
MAX_UPDATE_REPOS = PAGE * UPDATE_ROUNDS
# The most keys one page reads (`_updates_by_repository`): what a look costs stays bounded
# however long a run of updates the viewer may not see (one who sees none of their updates
# read every key of them on each look, 100,000 of them 0.7 s). Past it the page ends at the
# last key read, short, its cursor on.
MAX_UPDATE_KEYS = 1024


def _update_view(r: Any) -> dict[str, Any]:
    return {"item": r["item"], "kind": r["kind"], "actor": r["actor"],
            "summary": r["summary"], "at": iso(r["at"]), "cursor": int(r["seq"]),
            "contentIsData": True}  # a summary quotes the item's title


async def updates_page(store: Store, office: Office, viewer: str, before: int | None,
                       since: float | None, sees: Sees) -> dict[str, Any]:
    """The newest updates on the viewer's outcomes, each shown only where the viewer may see
    every item it names: the 30 newest of those, however many it may not see lie among or
    above them (up to MAX_UPDATE_KEYS looked through), with its cursor on the last where any
    update lies below it (`_updates_by_repository`); where its first read of keys names more than
    MAX_UPDATE_REPOS repositories, read in rounds (`_updates_in_rounds`)."""
    who = Whose.of(office, viewer)
    logins = logins_of(office, who)
    if sees is not None:
        page = await _updates_by_repository(store, who, logins, before, since, sees)
        if page is not None:
            return page
    return await _updates_in_rounds(store, who, logins, before, since, sees)


async def _updates_by_repository(
        store: Store, who: Whose, logins: list[str], before: int | None, since: float | None,
        sees: Callable[[Iterable[str]], Awaitable[set[str]]]) -> dict[str, Any] | None:
    """The page by the repositories of the viewer's updates: the keys of the updates on its
    outcomes (each one's seq and the repositories it names: `updates_for(keys=True)`), read
    newest first until a page of those whose every repository the viewer may see, and
    whether any update lies below it: a page first, then as many as the share of them shown
    so far says the page lacks (twice as many as the last, while none was shown), so a
    page with updates it may not see among them takes a read or two more of keys and no
    more of updates, up to MAX_UPDATE_KEYS keys a page: a longer run ends the page at
    the last key read, short, its cursor on. Each repository is asked of
    `sees` once (one item of each stands for it, as for the questions: visibility is per
    repository), and only those of the viewer's updates: for a person each is a forge
    request, and the office's other repositories are never asked about. Then the page is
    read by its seqs (`updates_at`), so what an update it does not show says never leaves
    the database, and checked with `sees` again (a safety net: what it hides leaves the
    page short, its cursor on). Past MAX_UPDATE_REPOS repositories, so that a page never
    asks of more: None where the first read passes it (the rounds), else the page ends at
    the last update above the first that would, short, its cursor on."""
    asked: dict[str, bool] = {}
    chosen: list[int] = []  # the page's seqs
    more: int | None = None
    cursor, limit, examined = before, PAGE + 1, 0
    while True:
        keys = await db.updates_for(store, who.everyone, logins, who.everyone, cursor, since,
                                    limit, org=who.org, keys=True)
        # the keys the page looks through: those above the first that would pass
        # MAX_UPDATE_REPOS (a read is as long as the share shown says the page lacks, and on
        # many repositories passed it far below the update that would fill the page)
        new: set[str] = set()
        took = len(keys)
        for i, k in enumerate(keys):
            its = {repo for repo in (k["repo"], k["about_repo"])
                   if repo and repo not in asked} - new
            if len(asked) + len(new) + len(its) > MAX_UPDATE_REPOS:
                took = i
                break
            new |= its
        if took < len(keys) and cursor == before:
            return None  # past it at the first read: the rounds, asking of what they read
        if new:
            seen = await sees({f"{repo}#1" for repo in new})
            asked.update({repo: f"{repo}#1" in seen for repo in new})
        for k in keys[:took]:  # ('' names no repository: never shown)
            if len(chosen) == PAGE:  # an update, shown or not, lies below the page's last
                more = chosen[-1]
                break
            if asked.get(k["repo"]) and (k["about_repo"] is None or asked.get(k["about_repo"])):
                chosen.append(int(k["seq"]))
        if more is None and took < len(keys):  # past it: the page ends at the last update
            # it looked at (an update lies below it: the one that would pass it), cursor on
            more = (chosen[-1] if len(chosen) == PAGE
                    else int(keys[took - 1]["seq"]) if took else cursor)
        if more is not None or len(keys) < limit:
            break  # (or every update below `before` read)
        cursor, examined = int(keys[-1]["seq"]), examined + len(keys)
        if examined >= MAX_UPDATE_KEYS and len(chosen) < PAGE:
            more = cursor  # as many keys as a page reads: it ends at the last, cursor on
            break
        limit = (-(-(PAGE - len(chosen)) * examined // len(chosen)) + 1 if chosen
                 else 2 * limit)
        # (a full page reads one key more, to tell whether any update lies below it)
        limit = min(limit, max(1, MAX_UPDATE_KEYS - examined))
    rows = await db.updates_at(store, chosen, org=who.org)
    names = {r["seq"]: update_names(r) for r in rows}
    shown = await sees(set().union(*names.values()))
    return {"updates": [_update_view(r) for r in rows if names[r["seq"]] <= shown],
            "moreUpdatesBefore": more}


async def _updates_in_rounds(store: Store, who: Whose, logins: list[str], before: int | None,
                             since: float | None, sees: Sees) -> dict[str, Any]:
    """The page read in rounds, hiding in Python what the viewer may not see: those updates
    are read past, at most `UPDATE_ROUNDS` rounds (each the next updates, as many as the
    page lacks): a page left short by them still has its cursor on.

    A round after the first reads ahead for the rounds after it: as many rows as the share
    of them the viewer saw so far says the page lacks (as many as the rounds left take at
    most, when it saw none), so a page with hidden updates takes one or two reads where it
    took up to four (bench.inbox: builder's and lee's took four), and each round takes the
    rows its own read would have returned: the page and its cursor are the same."""
    updates: list[dict[str, Any]] = []
    cursor, more = before, None
    ahead: list[Any] = []  # the next updates below `cursor`, read ahead
    ended = False  # `ahead` holds every update left below `cursor`
    examined = 0
    for left in range(UPDATE_ROUNDS, 0, -1):
        want = PAGE - len(updates)
        if len(ahead) <= want and not ended:  # this round's rows, and the one after them
            if not examined:  # the first read: a page (most pages fill at once)
                rows_ahead = want
            elif updates:  # the rows that hold what the page lacks, at the share seen
                rows_ahead = min(left * want, -(-want * examined // len(updates)))
            else:  # none seen yet: as many as the rounds left read at most
                rows_ahead = left * want
            read = rows_ahead + 1
            ahead = await db.updates_for(store, who.everyone, logins, who.everyone, cursor,
                                         since, read, org=who.org, least=want + 1)
            ended = len(ahead) < want + 1
        rows, ahead = ahead[:want + 1], ahead[want:]  # what this round's own read returned
        batch = rows[:want]
        examined += len(batch)
        names = {r["seq"]: update_names(r) for r in batch}
        shown = None if sees is None else await sees(set().union(*names.values()))
        updates += [_update_view(r) for r in batch
                    if shown is None or names[r["seq"]] <= shown]
        more = cursor = int(batch[-1]["seq"]) if len(rows) > want else None
        if more is None or len(updates) == PAGE:
            break
    return {"updates": updates, "moreUpdatesBefore": more}


async def latest_seen(store: Store, office: Office, owner: str, sees: Sees) -> int:
    """The seq of `owner`'s newest inbox delivery on an item the viewer may see (0: none
    found), reading past those it may not see at most `UPDATE_ROUNDS` pages: what moves a
    page's version when something new reaches the person or their agents, and never for
    something it does not show."""
    before = None
    for _ in range(UPDATE_ROUNDS):
        rows = await db.latest_deliveries(store, owner, before, PAGE, org=office.org)
        shown = None if sees is None else await sees({str(r["item"]) for r in rows})
        for r in rows:
            if shown is None or str(r["item"]) in shown:
                return int(r["seq"])
        if len(rows) < PAGE:
            break
        before = int(rows[-1]["seq"])
    return 0
