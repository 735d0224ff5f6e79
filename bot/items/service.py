"""Comments on items, with their I/O: validate, write the forge, then index + ledger in one
transaction, then wake the inboxes. The tools and the webhook handler both call `Comments`.

Order matters: every rule is checked before anything is written, so a refusal leaves nothing
behind; the forge write comes before the index so the index never points at a comment the
forge does not have (the hidden comment id is the marker that makes a retried write
idempotent).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from bot.email import keys
from bot.errors import Conflict, Denied, InvalidArguments, NotFoundError
from bot.forge.errors import ForgeError, NotFound
from bot.forge.gitea import GiteaForge
from bot.forge.once import comment_once
from bot.items import loop_guard, render, waiting
from bot.items.address import (
    Reached,
    Table,
    audience,
    check_addressed,
    gone_from,
    owner_of,
    resolve,
    table_reach,
)
from bot.items.inbox import wake_key
from bot.items.model import (
    Item,
    as_key,
    item_from_issue,
    native_parent,
    scope_of,
    shows_native_parent,
    split_ref,
)
from bot.items.questions import validate_question
from bot.items.threads import (
    ReplyKind,
    ThreadState,
    may_reply,
    may_resolve,
    reply,
    start,
    withdraw,
    without,
)
from bot.items.views import (
    claim_seen,
    claim_unnamed,
    comment_view,
    hidden_claims,
    named_in,
    thread_view,
)
from bot.office.config import Office
from bot.office.visibility import login_of, viewer_of
from bot.store import comments as db
from bot.store import idempotency, ledger, members

if TYPE_CHECKING:
    from bot.app.services import Services
    from bot.forge.base import Forge
    from bot.office.visibility import Viewer

log = logging.getLogger(__name__)

MAX_BODY = 10_000
MAX_COMMENTS_PER_ITEM = 2_000
ANSWERS_PAST_FULL = 5  # answers and amends a question takes once its item is full
MAX_OPEN_PER_ITEM = 5
MAX_OPEN_OVERALL = 100
CONTRIBUTOR = ("admin", "maintain", "write")


TARGET_FORMS = ('name an item by owner/repo#N (e.g. acme/product#12) or by the key its title '
                'or body gives it: a title "AC-12: ..." or "[AC-12] ...", or a body line '
                '"Key: AC-12"')


def _item_full(item: Item) -> Conflict:
    return Conflict(f"{item.ref} already has {MAX_COMMENTS_PER_ITEM:,} comments, the most an "
                    "item takes; continue on a new item that is `Part of` it (a question on "
                    f"it still takes its answer, and amends: {ANSWERS_PAST_FULL} in all past "
                    "the limit)", code="item_full")


def _a(kind: str) -> str:
    """An item's kind with its article: "an outcome", "a goal", "evidence" (uncountable)."""
    return kind if kind == "evidence" else f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def no_issue(repo: str, number: int) -> NotFoundError:
    return NotFoundError(f"no issue {repo}#{number}: give owner/repo#N of a goal, outcome, "
                         "plan or evidence")


@dataclass
class NewComment:
    body: str = ""
    to: list[str] = field(default_factory=list)
    cc: list[str] = field(default_factory=list)
    parent: str | None = None
    needs_reply: bool = False
    options: list[dict[str, Any]] | None = None
    header: str | None = None
    human_only: bool = False
    context: str | None = None
    option: str | int | None = None
    amend: bool = False
    confirmed: bool = False
    forge_id: int | None = None  # set when the comment was written in the forge by hand
    quiet: bool = False  # a tick in a card: the card shows it, no comment is posted
    key: str | None = None  # the caller's idempotencyKey: the comment's id is derived from it
    edited_at: float | None = None  # a forge comment edited before it was indexed: when


@dataclass
class Comments:
    services: Services
    forge: Forge
    office: Office

    # -- items ------------------------------------------------------------------------------
    async def load_item(self, repo: str, number: int) -> Item:
        """The item as the forge has it now (indexed on the way), with its claim filled in.
        An issue outside the office's org is none of its items (one bot account may reach
        several orgs, as on Gitea): "no issue", as for one that does not exist."""
        if repo.split("/", 1)[0].lower() != self.office.org.lower():
            raise no_issue(repo, number)
        try:
            issue = await self.forge.get_issue(repo, number)
        except NotFound as exc:
            raise no_issue(repo, number) from exc
        item = item_from_issue(self.office, repo, issue)
        if item is None:
            raise NotFoundError(f"{repo}#{number} is not an item: label it goal, outcome, plan "
                                "or evidence", code="not_an_item")
        return await self.index_item(item)

    async def with_native_parent(self, item: Item, issue: dict[str, Any], *,
                                 opened: bool = False) -> Item:
        """`item`, read from a webhook's issue, with its sub-issue parent. A webhook's issue
        does not say it (GitHub's webhook issue has no `parent_issue_url`): the index does,
        kept current by the `sub_issues` webhooks, while the `Part of` text agrees with it;
        otherwise the forge's issue says (one read, ETag-cached). An issue just `opened` and
        not yet indexed has no link the index missed (one made since comes as its own
        `sub_issues` webhook). Gitea and Forgejo have no sub-issues: the text alone."""
        if shows_native_parent(issue) or isinstance(self.forge, GiteaForge):
            return item
        known = await db.get_item(self.services.store, item.ref)
        if (known is None and opened) or (known is not None and known.parent == item.parent):
            return item
        try:
            full = await self.forge.get_issue(item.repo, item.number)
        except NotFound:
            return item
        # only its sub-issue link (which takes write access): its body may have been
        # edited since the act, by someone without it (the webhook's body is the act's)
        linked = native_parent(item.repo, full)
        return replace(item, parent=linked) if linked is not None else item

    async def index_item(self, item: Item, *, if_changed: bool = False,
                         by: str | None = None) -> Item:
        """Write `item` to the index (with the claim of the outcome a plan or evidence is
        under); `if_changed`: only where the index has it otherwise. `by`: who stands behind
        its body's `Part of` line (a webhook's sender who wrote the body, or took the issue in
        by the act it shows), None for a read of the forge or any other act (see `_linked`)."""
        store = self.services.store
        known = await db.get_item(store, item.ref)
        item = await self._linked(item, known, by)
        if item.kind in ("plan", "evidence") and item.parent:
            parent = await self.parent_item(item.parent)
            if parent is not None and parent.kind == "outcome":
                item = replace(item, claim=parent.claim)
        if if_changed and known == item:
            return item
        async with store.transaction() as tx:
            await db.put_item(tx, item)
            if known is not None and self.scope_of(known) != self.scope_of(item):
                # it implements another outcome or goal now: its decisions go with it
                await db.move_threads(tx, item.ref, self.scope_of(known), self.scope_of(item))
        return item

    async def _linked(self, item: Item, known: Item | None, by: str | None) -> Item:
        """`item` with the parent the index has, where its link changed and no one with write
        access to its repository need have changed it. On a public repository an issue's
        author may edit its `Part of` line: their link would hang it, and its decisions and
        updates, under any outcome of the org. `by` counts where given: the one who wrote the
        body, or took the issue in as it stood (handlers.items._body_by); a writer's other
        act after an outsider's edit vouches for nothing. Else, as for a read of the forge,
        which does not say who edited the body, the item's author (an issue whose author has
        write access is edited by no one without it). A sub-issue link, which takes write
        access, comes by its own webhook, its sender's."""
        was = known.parent if known is not None else None
        if item.parent == was:
            return item
        who = by if by is not None else item.author_principal
        return item if await self.can_write(item.repo, who) else replace(item, parent=was)

    async def parent_item(self, ref: str) -> Item | None:
        if ref.split("/", 1)[0].lower() != self.office.org.lower():
            return None  # another office's item is no parent of this one's
        known = await db.get_item(self.services.store, ref)
        if known is not None:
            return known
        where = split_ref(ref)
        if where is None:
            return None
        try:
            return await self.load_item(*where)
        except NotFoundError:
            return None

    async def target(self, target: str, kind: str | None,
                     viewer: Viewer | None = None, *, field: str = "target") -> Item:
        """The item `target` names, by owner/repo#N or by its key ("AC-12"); with a `viewer`,
        only if the viewer's forge account can see it: otherwise "no issue", as for one that
        does not exist (nothing is leaked). `field` is the argument it came in (errors name
        it); with "target", the kind came in `targetType`. A ref given out before its org or
        repository was renamed names the item by the names the viewer's office had."""
        where = split_ref(target)
        if where is not None and viewer is not None:
            where = (viewer.repo_now(where[0]), where[1])
        key = as_key(target) if where is None else None
        if where is None:
            where = await self._by_key(target, key, viewer, field)
        if viewer is not None and not await viewer.sees_repo(where[0]):
            raise no_issue(*where)
        item = await self.load_item(*where)
        if key is not None and item.key != key:  # retitled since it was indexed
            raise self._no_key(key, field)
        if kind is not None and item.kind != kind:
            kind_field = "targetType" if field == "target" else field
            raise InvalidArguments(f"{kind_field}: {item.ref} is {_a(item.kind)}, not "
                                   f"{_a(kind)}")
        return item

    async def _by_key(self, target: str, key: str | None, viewer: Viewer | None,
                      field: str = "target") -> tuple[str, int]:
        """The item of this office's org that gives itself `key`, as the index knows it; of
        several, the one whose author has write access to its repository."""
        if key is None:
            raise InvalidArguments(f"{field}: {target.strip()[:80]!r} is neither owner/repo#N "
                                   f"nor an item key; {TARGET_FORMS}")
        found = await db.items_by_key(self.services.store, key, self.office.org)
        if viewer is not None:
            found = [i for i in found if await viewer.sees_repo(i.repo)]
        if not found:
            raise self._no_key(key, field)
        if len(found) > 1:  # the key of an item its author with write access gave (no one
            # without it edits such an issue) outranks a key written by whoever opened an
            # issue on a public repository: theirs never shadows a member's item
            writers = [i for i in found if await self.can_write(i.repo, i.author_principal)]
            found = writers or found
        if len(found) > 1:
            raise Conflict(f"{field}: {len(found)} items give themselves the key {key} "
                           f"({', '.join(i.ref for i in found)}); name one by owner/repo#N, "
                           "or give each item a key of its own", code="ambiguous_key")
        return found[0].repo, found[0].number

    def _no_key(self, key: str, field: str = "target") -> NotFoundError:
        return NotFoundError(f"{field}: no item in {self.office.org} gives itself the key {key}; "
                             f"{TARGET_FORMS}", code="unknown_key")

    def scope_of(self, item: Item) -> str:
        """Questions on a plan or evidence count for the outcome or goal it belongs to."""
        return scope_of(item)

    # -- access -----------------------------------------------------------------------------
    async def role(self, repo: str, principal: str) -> str:
        if principal == "office":
            return "admin"
        login = login_of(self.office, principal) or (
            principal[6:] if principal.startswith("forge:") else None)
        if login is None:
            return "none"
        return await self.services.visibility.role(self.forge, repo, login)

    async def can_write(self, repo: str, principal: str) -> bool:
        """Whether `principal` has write access to `repo` (contributor or above)."""
        return await self.role(repo, principal) in CONTRIBUTOR

    async def deny(self, actor: str, subject: str, reason: str,
                   on_forge: str | None = None) -> Denied:
        await ledger.record(self.services.store, "run.denied", actor, subject, {"reason": reason},
                            org=self.office.org)
        return Denied(reason, subject=subject, ledgered=True, on_forge=on_forge)

    def is_editor(self, principal: str) -> bool:
        human = self.office.human(principal[6:]) if principal.startswith("human:") else None
        return bool(human and "editor" in human.permissions)

    def login(self, principal: str) -> str:
        return login_of(self.office, principal) or principal

    # -- adding -----------------------------------------------------------------------------
    async def add(self, actor: str, item: Item, new: NewComment) -> dict[str, Any]:
        """Add a comment; for one already on the forge (`forge_id`), once: a retried delivery
        gets back what the first one recorded, and nothing is written again."""
        store = self.services.store
        if new.forge_id is not None:
            done = await db.comment_by_forge_id(store, new.forge_id, item.ref)
            if done is not None:
                return await self._added(done, actor)
        if new.key is not None:  # a call with this key resumed after it had recorded it
            done = await db.get_comment(store, self._new_id(item, None, actor, new.key))
            if done is not None and (done.item, done.author) != (item.ref, actor):
                # a key whose id is someone else's comment (made to collide) gets a refusal,
                # never that comment (of another item, another office)
                raise Conflict(f"idempotencyKey: {new.key[:80]!r} names another comment's id;"
                               " send the comment again with a new key", code="key_in_use")
            if done is not None:
                return await self._added(done, actor)
        body = new.body.replace("\r\n", "\n").strip()
        if not body and new.option is None:
            raise InvalidArguments("body: empty; write the comment, or answer with option",
                                   on_forge="nothing to say: write your words after the "
                                   "command (`/reply [<header or id>] <your words>`)")
        if len(body) > MAX_BODY:
            raise InvalidArguments(f"body: {len(body):,} characters; a comment takes at most "
                                   f"{MAX_BODY:,}. Shorten it or split it into a few comments")
        full = await db.count_comments(store, item.ref) >= MAX_COMMENTS_PER_ITEM
        if full and new.parent is None:
            raise _item_full(item)
        parent = await self._parent_thread(item, new.parent)
        await self._check_writer(actor, item, parent)
        # the claim as the writer may know it: a hidden outcome's is neither addressed as
        # `agent` nor reached, which the answer's `notify` and the forge's mention would name
        claim = await claim_seen(item, viewer_of(self.services, self.forge, self.office, actor))
        table = Table(item.kind, item.author if item.kind == "plan" else None, claim)
        await self._check_present([*new.to, *new.cc])
        to = resolve(self.office, new.to, author=actor, claim=claim, field="to")
        cc = resolve(self.office, new.cc, author=actor, claim=claim, field="cc")
        check_addressed([*to, *cc])
        await self._check_addressed(actor, item, [*to, *cc])
        comment_id = self._new_id(item, new.forge_id, actor, new.key)
        now = time.time()
        # the loop guard (bot.items.loop_guard): past it, recorded and shown, waking no agent.
        # Its conversation's run is read and this comment recorded one writer at a time on
        # this replica, so two agents writing at once through it are each counted, and the
        # forge's order, which a rebuild reads, is the index's. Not the database's lock: it
        # is held across the forge write, and a replica stalled there (its create held, its
        # key taken over by the retry) would hold up every comment in the conversation,
        # the retry's too. Across replicas, comments at the same moment may each read the
        # run without the others: those in flight at once, never more (the next reads all)
        where = loop_guard.conversation(parent.id if parent else comment_id, new.parent)
        async with self.services.store.local_lock(f"comment-run:{item.ref}:{where or ''}"):
            if parent is not None:  # as the last writer in it left it
                parent = await db.get_thread(store, parent.id) or parent
            hops = await db.agents_in_a_row(store, item.ref, where) \
                if loop_guard.is_agent(actor) else 0
            guard = loop_guard.held(actor, hops)
            if parent is None:
                state = await self._start(actor, item, new, body, to, cc, table)
                thread_id, kind = comment_id, ("question" if state.is_question else "comment")
                candidates = [*table_reach(table), *to, *cc]
                row = db.ThreadRow(thread_id, item.ref, self.scope_of(item), state, None, None,
                                   None, now)
            else:
                state, reply_kind = await self._reply(actor, item, parent, new, body, to, cc,
                                                      comment_id, now)
                if full and not await self._answers_when_full(item, parent, reply_kind):
                    raise _item_full(item)
                thread_id, kind = parent.id, reply_kind
                candidates = [Reached(p, w) for p, w in state.members.items()]
                answered = now if reply_kind in ("answer", "amend") else parent.answered_at
                # the scope as the item is now (fresh from the forge), not as the thread last had it
                row = replace(parent, state=state, answered_at=answered,
                              scope=self.scope_of(item))
            if guard:
                row = replace(row, state=loop_guard.no_agents_turn(
                    parent.state.waiting_on if parent else (), row.state))
                state = row.state
            # those addressed, and those whose turn it now is (seed: "Your follow-up hands it back
            # to them"), hear it even when they are the writing agent's own person
            reached = audience(self.office, author=actor, candidates=candidates,
                               explicit=[*(r.principal for r in [*to, *cc]), *state.waiting_on])
            # the people reached personally are mentioned, and so is each agent reached through
            # its person's box, by its own account: an agent that reads only its forge
            # notifications misses nothing (issue 26). One mention, in this comment only; by a
            # forge account only (a principal is no login: "@human:lee@acme.com" mentions nobody)
            # (the claim of an outcome in another repository only where the writer named its
            # holder: the forge shows the comment to readers of the item who may not see it)
            hidden = claim_unnamed(item, [*new.to, *new.cc])
            mentions = [login for r in reached if (login := login_of(self.office, r.principal))
                        and (r.way == "personal" or (r.principal.startswith("agent:")
                                                     and not guard))
                        and r.principal != hidden]
            # the writer, as the forge names them: a hidden claim holder as the card names them,
            # unless the thread's question named them (a reply's own to/cc names nobody's author)
            unnamed = await self.unnamed_in(item, parent) if parent is not None else hidden
            row, forge_id = await self._write_forge(new, body, comment_id, item, row, kind,
                                                    mentions, hidden,
                                                    author=self._named_as(actor, unnamed))
            answer = row.state.answer if kind in ("answer", "amend") else None
            record = db.CommentRow(comment_id, item.ref, thread_id, new.parent, actor, body, {
                "to": new.to, "cc": new.cc, "kind": kind,
                "option": answer.option if answer else None, "amend": new.amend,
                "confirmedWithPerson": new.confirmed,
                "notify": [r.as_json() for r in reached],
                "addressed": [r.principal for r in [*to, *cc]],
                **({"loopGuard": guard} if guard else {}),
            }, forge_id, now, edited_at=new.edited_at)
            await self._commit(actor, item, record, row, kind, reached, to, cc, hops)
        if row.state.is_question:
            # someone asked who left meanwhile (a config taken since this replica read it,
            # its sweep done before this was recorded): sent back now. Read after the commit,
            # so a sweep that did not find this question finds them recorded here
            gone = await self._departed()
            if without(row.state, gone) != row.state:
                stored = await db.get_thread(self.services.store, row.id)
                row = (await self._send_back(stored, gone) if stored else None) or row
        if row.state.is_question:  # asked, answered or passed on: the forge shows who it waits on
            await waiting.sync(self, row.scope)
        return await self._as_added(actor, record, row)

    async def _answers_when_full(self, item: Item, parent: db.ThreadRow,
                                 kind: ReplyKind) -> bool:
        """Whether a reply to an item that is full goes in all the same: an answer or amend,
        while its question has had fewer than ANSWERS_PAST_FULL of them past the cap. Anyone
        a question asks may reply without write access, so an outsider asked once could fill
        the item; its questions are still answered, and each only a few times more."""
        if kind not in ("answer", "amend"):
            return False
        past = await db.count_past(self.services.store, item.ref, parent.id,
                                   MAX_COMMENTS_PER_ITEM)
        return past < ANSWERS_PAST_FULL

    @staticmethod
    def _new_id(item: Item, forge_id: int | None, actor: str = "",
                key: str | None = None) -> str:
        """A fresh id; for a comment already on the forge, one derived from its forge id (and
        for a tool call with an idempotencyKey, from the key), so that a retry after a crash
        writes under the same marker (found, not doubled)."""
        if forge_id is not None:
            seed = f"{item.repo}\n{forge_id}"
        elif key is not None:
            seed = f"{item.repo}\nkey\n{actor}\n{key}"
        else:
            return "c" + secrets.token_hex(16)
        # 128 bits: ids are one space for every office, and a hand comment's is predictable
        # (its repository, the forge's next comment id): a short one could be taken first by
        # another office's key made to collide, and that comment never indexed
        return "c" + hashlib.sha256(seed.encode()).hexdigest()[:32]

    async def _added(self, c: db.CommentRow, actor: str) -> dict[str, Any]:
        """What `add` returned for a comment it already recorded."""
        t = await db.get_thread(self.services.store, c.thread)
        assert t is not None
        return await self._as_added(actor, c, t)

    async def _as_added(self, actor: str, c: db.CommentRow, t: db.ThreadRow) -> dict[str, Any]:
        """What `add` returns to `actor` for comment `c` in thread `t`: nothing that names a
        claim holder they may not be told of (`views.hidden_claims`), reached or not."""
        sees = viewer_of(self.services, self.forge, self.office, actor).visible
        hidden = (await hidden_claims(self.services.store, [t], sees)).get(t.id)
        reached = [r for r in c.data.get("notify", []) if r["principal"] != hidden]
        out: dict[str, Any] = {"comment": comment_view(c, hidden=hidden),
                               "thread": thread_view(t, actor, hidden=hidden),
                               "notify": reached,
                               "addressed": [p for p in c.data.get("addressed", [])
                                             if p != hidden]}
        if c.data.get("loopGuard"):  # past the loop guard: why it woke no agent (as mail's
            out["loopGuard"] = c.data["loopGuard"]  # quiet delivery says), and whose inbox
            # has it unwoken: notified are only those it woke (`_commit`), people personally
            out["notify"] = [r for r in reached if r["way"] == "personal"]
            out["deliveredUnwoken"] = [r["principal"] for r in reached if r["way"] != "personal"]
        return out

    async def _parent_thread(self, item: Item, parent: str | None) -> db.ThreadRow | None:
        if parent is None:
            return None
        store = self.services.store
        c = await db.get_comment(store, parent)
        if c is None or c.item != item.ref:  # (the item is of this office: so is the comment)
            raise NotFoundError(f"parent: no comment {parent!r} on {item.ref}; give the `id` "
                                "of a comment on this item")
        t = await db.get_thread(store, c.thread)
        if t is None:  # a comment deleted on the forge before it was indexed: no thread
            raise NotFoundError(f"parent: no comment {parent!r} on {item.ref}; give the `id` "
                                "of a comment on this item")
        return t

    async def _check_writer(self, actor: str, item: Item, parent: db.ThreadRow | None) -> None:
        """Whether `actor` may write here at all: asked before the comment's `to` and `cc`
        are read, whose refusals name the office's agents, teams and people (a stranger on a
        public repository learnt them from one comment)."""
        asked = parent is not None and may_reply(parent.state, self.office, actor)
        if not await self.can_write(item.repo, actor) and not asked:
            raise await self.deny(actor, item.ref, (
                f"{actor} needs contributor (write) access to {item.repo} to comment on "
                f"{item.ref}; only people a question is addressed to may reply without it"))

    async def _check_present(self, entries: list[str]) -> None:
        """Nobody addressed by name (an email, agent:<slug>) has left the office, as the
        newest config taken on any replica says (`members.departed`): this one's may still
        name them. (One in a team of an older config is sent back after: `add`.)"""
        if not entries:
            return
        gone = await self._departed()
        named = {e.strip().lower() for e in entries}
        names = sorted({login for p, login in gone.items()
                        if p in named or p.removeprefix("human:") in named})
        if names:
            raise InvalidArguments(
                f"to/cc: {', '.join(names)} {'has' if len(names) == 1 else 'have'} left the "
                "office (its config names them no more); address someone still in it")

    async def _check_addressed(self, actor: str, item: Item, addressed: list[Reached]) -> None:
        blind = [r.principal for r in addressed
                 if await self.role(item.repo, r.principal) == "none"]
        if blind:
            raise await self.deny(actor, item.ref, (
                f"{', '.join(blind)} cannot see {item.ref}; a comment never shares an item. "
                "Give them access on the forge first, or address someone who can see it"))

    async def _start(self, actor: str, item: Item, new: NewComment, body: str,
                     to: list[Reached], cc: list[Reached], table: Table) -> ThreadState:
        question = validate_question(body, needs_reply=new.needs_reply, options=new.options,
                                     header=new.header, human_only=new.human_only,
                                     context=new.context)
        if new.option is not None or new.amend or new.confirmed:
            raise InvalidArguments("option/amend/confirmedWithPerson answer a question: give "
                                   "parent, the id of the question's comment")
        if question is not None:
            store = self.services.store
            org = self.office.org
            if await db.count_open_questions(store, actor, item.ref,
                                             org=org) >= MAX_OPEN_PER_ITEM:
                raise Conflict(f"you have {MAX_OPEN_PER_ITEM} open questions on {item.ref}, the "
                               "most one asker may; follow up in a thread you have, or resolve "
                               "the ones you have used", code="too_many_questions")
            if await db.count_open_questions(store, actor, org=org) >= MAX_OPEN_OVERALL:
                raise Conflict(f"you have {MAX_OPEN_OVERALL} open questions in all, the most "
                               "one asker may; resolve the ones you have used",
                               code="too_many_questions")
        return start(actor, question=question, to=to, cc=cc, reached=table_reach(table))

    async def _reply(self, actor: str, item: Item, parent: db.ThreadRow, new: NewComment,
                     body: str, to: list[Reached], cc: list[Reached], comment_id: str,
                     now: float) -> tuple[ThreadState, ReplyKind]:
        if new.needs_reply or new.options or new.header or new.human_only or new.context:
            raise InvalidArguments("a reply cannot ask a new question: leave out parent to ask "
                                   "one, or reply in words")
        # (anyone who left the office since, and was not swept at the config change: the
        # thread as it reads without them, before and after this reply: `threads.without`)
        parent = replace(parent, state=self.without_gone(parent.state))
        q = parent.state.question
        option = q.option_index(new.option) if new.option is not None and q else None
        if new.option is not None and q is None:
            raise InvalidArguments("option: this thread is not a question; reply with body")
        try:
            state, kind = reply(parent.state, self.office, actor, comment=comment_id, at=now,
                                body=body, option=option, amend=new.amend,
                                confirmed=new.confirmed, to=to, cc=cc)
        except Denied as exc:  # a question's rules (who answers, humanOnly): a permission
            raise await self.deny(actor, item.ref, exc.message, exc.on_forge) from exc
        return self.without_gone(state), kind

    def without_gone(self, state: ThreadState) -> ThreadState:
        """The thread without those in it who have left the office."""
        return without(state, gone_from(self.office, [*state.members, *state.waiting_on]))

    # -- leaving ----------------------------------------------------------------------------
    async def left_office(self) -> None:
        """Those the office's configs named once and name no more (`members.departed`, with
        the login they had) have left: the open questions still waiting on them wait on them
        no more, and one that then waits on nobody goes back to its asker, its card and the
        asker's inbox saying why (`threads.without`). Run at each config taken, changed or
        not: driven by the record, not by one push's diff, a sweep cut off part-way (a crash,
        the forge) is finished by the next, on any replica; each question is sent back once
        (`_send_back`). A reply in a thread reads it the same way (`without_gone`), and nobody
        who left is reached any more (`address.audience`)."""
        gone = await self._departed()
        scopes: set[str] = set()
        for t in await db.open_questions_involving(self.services.store, list(gone),
                                                   org=self.office.org):
            if (row := await self._send_back(t, gone)) is not None:
                scopes.add(row.scope)
        for scope in sorted(scopes):
            await waiting.sync(self, scope)

    async def _departed(self) -> dict[str, str]:
        """Who has left the office (principal: the name people knew them by, a person's login
        then, an agent's slug), as recorded by the newest config taken on any replica: this
        one's may be older (`members.departed`)."""
        known = await members.departed(self.services.store, self.office.org)
        return {p: login if p.startswith("human:") else p.removeprefix("agent:")
                for p, login in known.items()}

    async def _send_back(self, t: db.ThreadRow, gone: dict[str, str]) -> db.ThreadRow | None:
        """The question without those in `gone`, written over it as read and only so
        (`db.swap_thread`): a reply, or another replica's sweep, written meanwhile is read
        again and kept, and the question is sent back (its asker's box woken) once. None
        when there was nothing to do."""
        store, org = self.services.store, self.office.org
        while True:
            row = replace(t, state=without(t.state, gone))
            if row.state == t.state or not t.state.is_question:
                return None
            item = await db.get_item(store, t.item)
            if item is not None:
                try:
                    row = await self.refresh_card(item, row)
                except ForgeError as exc:  # the card is put right at the thread's next change
                    log.warning("left the office: card of %s not rewritten: %s", t.id, exc)
            if await db.swap_thread(store, t, row):
                break
            fresh = await db.get_thread(store, t.id)  # written meanwhile: again, from that
            if fresh is None:
                return None
            t = fresh
        if row.state.returned:  # the asker's box wakes: it is theirs again
            asker = row.state.asker
            box = "agents" if asker.startswith("agent:") else "you"
            self.services.notifier.notify([wake_key(owner_of(self.office, asker), box)],
                                          org=org)
        return row

    async def _write_forge(self, new: NewComment, body: str, comment_id: str, item: Item,
                           row: db.ThreadRow, kind: str, mentions: list[str],
                           hidden: str | None, *, author: str) -> tuple[db.ThreadRow, int | None]:
        """Post what the forge lacks: the card for a question, the comment for a tool call,
        by `author` (`_named_as`).

        Returns the thread (its card rewritten when the reply changed it) and the forge id of
        the comment that stands for this one."""
        forge_id = new.forge_id
        # a keyed write, or a forge comment's delivery, may have other tries: an earlier one
        # (this is resumed) may have posted it, and one taken over may land its create late
        tried = new.key is not None or new.forge_id is not None
        again = new.forge_id is not None or (tried and idempotency.resumed())

        async def once(text: str, mark: str) -> dict[str, Any]:
            async def posted() -> dict[str, Any] | None:
                return await self._posted(item, mark) if again else None
            return await comment_once(self.forge, item.repo, item.number, text, mark,
                                      look=tried, find=posted)

        if kind == "question":
            card = await self._sealed(item, render.render_card(
                comment_id, author=author, state=row.state, mentions=mentions,
                logins=self._logins(hidden), asked=self._asked_logins(row.state, hidden),
                hidden=hidden))
            posted = await once(card, render.marker(comment_id, kind="question"))
            row = replace(row, card_id=int(posted["id"]), card_body=card)
            return row, new.forge_id if new.forge_id is not None else row.card_id
        if new.forge_id is None and not new.quiet:
            note = {"answer": f"answer: {row.state.answer.option}" if row.state.answer
                    and row.state.answer.option else "answer", "amend": "changed the answer",
                    "pass_on": "passed on"}.get(kind, "")
            text = await self._sealed(item, render.render_comment(
                comment_id, author=author, body=body, mentions=mentions,
                thread=row.id if new.parent else None, note=note))
            forge_id = int((await once(text, render.marker(comment_id)))["id"])
        if row.state.is_question and row.card_id is not None and kind != "comment":
            row = await self.refresh_card(item, row)
        return row, forge_id

    async def _posted(self, item: Item, mark: str) -> dict[str, Any] | None:
        """The app's comment on the item that opens with `mark` (where the app puts it), if it
        is there: one carrying it elsewhere holds someone's words the app posted."""
        for c in reversed(await self.forge.list_comments(item.repo, item.number)):
            if self.services.by_app(c) and str(c.get("body") or "").startswith(mark):
                return c
        return None

    async def _sealed(self, item: Item, text: str) -> str:
        """A comment or card as the app posts it on `item`: sealed, bound to the item's issue,
        so a rebuild takes it only as the app wrote it and only there (`bot.items.rebuild`).
        An item read from the index has no forge id: its issue is read (ETag-cached)."""
        issue = item.forge_id
        if issue is None:
            issue = int((await self.forge.get_issue(item.repo, item.number))["id"])
        return render.seal(text, keys.comment_key(self.services.settings.data_dir,
                                                  self.office.org), issue)

    def _asked_logins(self, state: ThreadState, hidden: str | None) -> list[str]:
        """The forge accounts of those a question asks, people and agents alike (but the
        claim holder the card may not name, `hidden`)."""
        return [login for p in state.asked if p != hidden and (login := login_of(self.office, p))]

    def _named_as(self, who: str, hidden: str | None) -> str:
        """How the forge names writer `who`: a person by login, an agent by principal, and
        `hidden`, a claim holder it may not name, as the `to` entry that reaches it (as
        `_logins` names them on a card)."""
        if who == hidden:
            return "agent"
        return self.login(who) if who.startswith("human:") else who

    def _logins(self, hidden: str | None) -> dict[str, str]:
        """How a card names each principal (`render.card_logins`)."""
        return render.card_logins(self.office, hidden)

    async def unnamed_in(self, item: Item, row: db.ThreadRow) -> str | None:
        """The claim holder the forge may not name in thread `row` on `item` (indexed, with its
        outcome's claim), to whoever reads the item there: as the question was posted (`add`),
        by its asker's to/cc (`views.claim_unnamed`)."""
        if claim_unnamed(item, []) is None:  # none to hide: the question need not be read
            return None
        return claim_unnamed(item, named_in(await db.get_comment(self.services.store, row.id)))

    async def refresh_card(self, item: Item, row: db.ThreadRow) -> db.ThreadRow:
        """Rewrite the card to show the answer, its history and whether it is resolved."""
        if row.card_id is None:
            return row
        hidden = await self.unnamed_in(item, row)
        author = self._named_as(row.state.asker, hidden)
        mentions = self._asked_logins(row.state, hidden)
        card = await self._sealed(item, render.render_card(
            row.id, author=author, state=row.state, mentions=mentions,
            logins=self._logins(hidden), asked=mentions, hidden=hidden))
        if card != row.card_body:
            try:
                await self.forge.update_comment(item.repo, row.card_id, card)
            except NotFound:  # someone deleted the card: the question gets it back (once,
                # across the tries of the answer or delivery that found it gone)
                mark = render.marker(row.id, kind="question")
                posted = await comment_once(self.forge, item.repo, item.number, card, mark,
                                            find=lambda: self._posted(item, mark))
                return replace(row, card_id=int(posted["id"]), card_body=card)
        return replace(row, card_body=card)

    async def _commit(self, actor: str, item: Item, record: db.CommentRow, row: db.ThreadRow,
                      kind: str, reached: list[Reached], to: list[Reached],
                      cc: list[Reached], hops: int) -> None:
        s = row.state
        data: dict[str, Any] = {
            "comment": record.id, "item": item.ref, "thread": row.id, "parent": record.parent,
            "kind": kind, "notify": [r.as_json() for r in reached],
            "to": [r.principal for r in to], "cc": [r.principal for r in cc],
        }
        if s.question is not None:
            data.update(needsReply=True, header=s.question.header, humanOnly=s.question.human_only,
                        waitingOn=list(s.waiting_on),
                        options=[o.public() for o in s.question.options])
            if s.answer is not None:
                data["answers"] = [{"option": a.option, "body": a.body, "by": a.by,
                                    "confirmedWithPerson": a.confirmed_with_person}
                                   for a in (s.answer, *reversed(s.history))]
        woken = []  # each box wakes its own waiters: a person's never wakes for the agents'
        guard = record.data.get("loopGuard")
        org = self.office.org
        keys = [db.inbox_key(org, owner_of(self.office, r.principal)) for r in reached]
        # a try taken over indexes nothing (the retry that took it records the comment it kept)
        async with idempotency.fenced(self.services.store, f"comment {record.id}",
                                      *keys, ledger.key(org)) as tx:
            await db.put_comment(tx, record)
            await db.put_thread(tx, row)
            # boxes in one order (each delivery holds its box's key: see db.deliver)
            for r in sorted(reached, key=lambda r: owner_of(self.office, r.principal)):
                owner = owner_of(self.office, r.principal)
                box = "you" if r.way == "personal" else "agents"
                if box == "you" or not guard:  # past the loop guard no agents' box wakes
                    woken.append(wake_key(owner, box))
                await db.deliver(tx, owner, box, r.principal, record.id, org=self.office.org)
            await ledger.append(tx, "comment.added", actor, item.ref, data, org=self.office.org)
            if guard:
                await ledger.append(tx, "comment.loop_guard", actor, item.ref, {
                    "comment": record.id, "thread": row.id, "hops": hops, "reason": guard},
                    org=self.office.org)
            if kind in ("answer", "amend"):
                await ledger.append(tx, "comment.answered", actor, item.ref, {
                    "thread": row.id, "comment": record.id, "amend": kind == "amend",
                    "answers": data.get("answers", [])}, org=self.office.org)
        self.services.notifier.notify(woken, org=self.office.org)

    # -- following the forge ----------------------------------------------------------------
    async def forge_edited(self, item: Item, forge_id: int, text: str) -> None:
        """Forge comment `forge_id` was edited, and the forge shows `text` now: the words people
        read of it follow (marked edited). Nothing else does: an edit runs no command, answers
        nothing and addresses no one (docs/using.md), so a question or answer it made keeps
        what was asked or decided. One not indexed yet (its `created` late) is indexed in
        these words when that comes (`db.note_early_edit`)."""
        store = self.services.store
        c = await db.comment_by_forge_id(store, forge_id, item.ref)
        if (c is not None and c.deleted_at is not None) or \
                await db.thread_by_card(store, forge_id, item.ref) is not None:
            return  # gone, or a card: the app's own words
        words = render.edited_words(text)
        if words is None:  # too long to read: not read, its words kept (a refusal raised
            return  # here was a delivery retried until it died)
        body = words.replace("\r\n", "\n").strip()
        if c is None:  # its `created` is late: indexed in these words when it comes (its
            # commands, if any, from the words it was written in, as an edit after it would)
            await db.note_early_edit(store, item.ref, forge_id, body[:MAX_BODY])
        elif body != c.body:
            async with store.transaction() as tx:
                await db.edit_comment(tx, c.id, body[:MAX_BODY])

    async def forge_deleted(self, actor: str, item: Item, forge_id: int,
                            author: str) -> None:
        """Forge comment `forge_id` (by `author`) was deleted on the forge by `actor`: it leaves
        the inboxes, its words leave the index (a tombstone stays), an answer it gave is
        withdrawn and a question it asked closed (`threads.withdraw`), and the app's ping for it
        says it was deleted. One not indexed yet gets its tombstone now, so its `created`,
        delivered late, indexes nothing. A question's card is the app's: deleted, it is posted
        again (`refresh_card`), as before."""
        store = self.services.store
        if await db.thread_by_card(store, forge_id, item.ref) is not None:
            return
        c = await db.comment_by_forge_id(store, forge_id, item.ref)
        org = self.office.org
        if c is None:
            cid = self._new_id(item, forge_id)
            async with store.transaction() as tx:
                await db.put_comment(tx, db.CommentRow(
                    cid, item.ref, cid, None, author, "", {"kind": "deleted"}, forge_id,
                    time.time(), deleted_at=time.time()))
            return
        if c.deleted_at is not None:
            return
        t = await db.get_thread(store, c.thread)
        row = None
        if t is not None and t.state.is_question:
            state = withdraw(t.state, c.id, asked_it=c.id == t.id)
            answered = None if t.state.answer and state.answer is None else t.answered_at
            row = await self.refresh_card(item, replace(t, state=state, answered_at=answered))
        owners = [owner_of(self.office, r["principal"]) for r in c.data.get("notify", [])]
        withdrawn = t is not None and t.state.answer is not None and \
            t.state.answer.comment == c.id
        async with store.transaction(ledger.key(org)) as tx:
            await db.forget_comment(tx, c, owners, org=org)
            if row is not None:
                await db.put_thread(tx, row)
            await ledger.append(tx, "comment.deleted", actor, item.ref, {
                "comment": c.id, "thread": c.thread, "author": c.author,
                "withdrawnAnswer": withdrawn}, org=org)
        mark = render.marker(c.id, kind="ping")
        ping = await self._posted(item, mark)
        if ping is not None:
            await self.forge.update_comment(item.repo, int(ping["id"]), (
                f"{mark}\nThe comment this note was about was deleted on the forge."))
        if row is not None:
            await waiting.sync(self, row.scope)

    # -- resolving --------------------------------------------------------------------------
    async def resolve(self, actor: str, comment_id: str,
                      viewer: Viewer | None = None) -> db.ThreadRow:
        store = self.services.store
        c = await db.get_comment(store, comment_id)
        t = await db.get_thread(store, c.thread) if c else None
        if c is None or t is None or c.item.split("/", 1)[0].lower() != self.office.org.lower() \
                or (viewer is not None and not await viewer.sees_ref(c.item)):
            raise NotFoundError(f"comment: no comment {comment_id!r}; give a comment's `id`")
        item = await db.get_item(store, t.item)
        assert item is not None
        s = t.state
        if not may_resolve(s, self.office, actor, editor=self.is_editor(actor)):
            raise await self.deny(actor, t.item, (
                f"only the asker ({s.asker}) or an editor can resolve this question: resolving "
                "says its answer was used"))
        if not s.is_question and await self.role(item.repo, actor) not in CONTRIBUTOR \
                and actor not in s.members:
            raise await self.deny(actor, t.item, f"{actor} needs contributor access to "
                                                 f"{item.repo} to resolve threads")
        if s.resolved:
            return t
        row = replace(t, state=replace(s, resolved=True))
        if s.is_question:
            row = await self.refresh_card(item, row)
        async with store.transaction(ledger.key(self.office.org)) as tx:
            await db.put_thread(tx, row)
            await ledger.append(tx, "comment.resolved", actor, t.item,
                                {"thread": t.id, "comment": comment_id}, org=self.office.org)
        if s.is_question:
            await waiting.sync(self, row.scope)
        return row


async def left_office(services: Services, forge: Forge, office: Office) -> None:
    """`Services.left_office`: see `Comments.left_office`."""
    await Comments(services, forge, office).left_office()
