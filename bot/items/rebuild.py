"""Rebuild the work graph from the forge (`vaultmail reindex`, after the mail): items, their
comments, the threads with their questions, answers and decisions, who each question waits
on, and the inbox deliveries.

The forge holds all of it in what people and the app wrote there: an item is an issue with an
item label; a comment the app posted for a tool call opens with its marker (`<!-- vaultmail:
comment id=… -->`) and says who wrote it, in which thread and as what (`render.render_comment`);
a question is its card (`kind=question`: asker, those asked, the question, its options, and
the answer a tick gave); a hand comment is read as the webhook read it (`/ask`, `/answer`,
`/confirmed`, `/reply`, or words). Each item's comments are replayed in forge order through
the thread rules (`bot.items.threads`), so a thread comes out as it was built.

What the forge never had is not invented: an option's `then` (the asker's note, kept only in
the index), the raw `to`/`cc` spellings of a tool call (the comment names those it reached),
resolved marks on threads that are not questions, and read marks. A rebuild fills in what the
index lacks and keeps every row it has (which may know more), so running it twice changes
nothing; the deliveries it adds are read already (docs/using.md, "Reindex").
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from bot.errors import VaultmailError
from bot.items import loop_guard, render
from bot.items.address import (
    Reached,
    Table,
    audience,
    owner_of,
    person_of,
    resolve,
    table_reach,
)
from bot.items.forge_commands import Aimed, aim_answer, aim_reply, answering
from bot.items.model import Item, item_from_issue, native_parent, scope_of
from bot.items.questions import Option, Question
from bot.items.service import CONTRIBUTOR, MAX_BODY, Comments
from bot.items.threads import Answer, ThreadState, may_answer, may_reply, reply, start
from bot.items.views import claim_seen, claim_unnamed, parse_time
from bot.mail.commands import parse_commands
from bot.mail.markdown import as_written
from bot.office.config import Office
from bot.office.visibility import Viewer, Visibility
from bot.store import comments as db
from bot.store.moves import edited_since_written, forge_time

if TYPE_CHECKING:
    from bot.forge.base import Forge
    from bot.store import Store


@dataclass
class WorkReport:
    items: int = 0
    comments: int = 0  # comments added to the index (those it had are kept)
    questions: int = 0  # question threads added
    deliveries: int = 0
    skipped: list[str] = field(default_factory=list)  # the app's comments edited on the forge
    # (or copied there from another item: each `copied` is in `skipped` too)
    copied: list[str] = field(default_factory=list)  # one v1-sealed text on several items


_MARKER = re.compile(r"^<!-- vaultmail:comment id=(?P<id>c[0-9a-f]{32})(?P<kind> kind=\w+)?"
                     r" -->$")
_CARD_HEAD = re.compile(r"^❓ \*\*Question\*\* from \*\*(?P<author>.+?)\*\*"
                        r" for (?P<who>.+?)(?: · cc (?P<cc>.+?))?"
                        r"(?P<human> · \*a person decides \(human only\)\*)?$")
_OPTION = re.compile(r"^- \[(?P<mark>[ x])\] (?P<n>\d+)\. \*\*(?P<label>.*?)\*\*"
                     r"(?P<rec> \(recommended\))?(?: — (?P<description>.*))?$")
_FOLD = "<details><summary>Context</summary>"  # (`render.render_card`'s, before its context)
_STATUS = ("**Answered** by ", "Tick a box, or reply", "Reply `/answer` and your answer.",
           "**Answer withdrawn**", "*This question was deleted")
_COMMENT_HEAD = re.compile(r"^💬 \*\*(?P<author>.+?)\*\*"
                           r"(?: replied in thread `(?P<thread>c[0-9a-f]+)`)?"
                           r"(?: \((?P<note>.*?)\))?(?: · for (?P<mentions>@.+))?$")
# who answered: a login, or an agent's principal (`render.card_logins`: its colon is no end)
_ANSWERED = re.compile(r"^\*\*Answered\*\* by (?P<login>(?:agent:)?[^:( ]+)")


def _written(text: str) -> str:
    """Words the app posted as data, as their writer wrote them (`render._neutralise` undone)."""
    lines = [re.sub(r"^(\s*[-*]\s+)\\\[", r"\1[", line) for line in text.split("\n")]
    return as_written("\n".join(lines))


@dataclass
class _Replay:
    """One item's comments replayed: what the index gets for it."""

    office: Office
    item: Item
    forge: Forge
    visibility: Visibility  # the rebuild's: each writer's access asked once
    claims: dict[str, str | None] = field(default_factory=dict)  # writer -> the claim seen
    threads: dict[str, db.ThreadRow] = field(default_factory=dict)
    comments: list[db.CommentRow] = field(default_factory=list)
    asks: dict[str, int] = field(default_factory=dict)  # question id -> its hand `/ask`
    ticks: list[tuple[str, str, int, str]] = field(default_factory=list)  # unmarked cards'

    resolved: set[str] = field(default_factory=set)  # questions whose card says so
    writers: set[str] = field(default_factory=set)  # logins with write access to the repository
    skipped: list[int] = field(default_factory=list)  # the app's comments not as it wrote them
    copied: list[int] = field(default_factory=list)  # those of them a v1 seal on another item
    # question id -> the answers its card shows, oldest first (`carded`), each with the mark
    # naming its comment (none on a card from before marks), and how many of them the replay
    # has met so far
    answers: dict[str, list[Carded]] = field(default_factory=dict)
    met: dict[str, int] = field(default_factory=dict)
    # what the cards (sealed) say, read before any comment is replayed (`read_card`): each
    # comment id a mark names -> its question and the answer it gave (a hand comment's:
    # `given`; a tick's: `carded_ticks`), the cards' ids (the `/ask` each came from has it),
    # and those `/ask` comments the forge shows edited since (`ask_now`)
    gave: dict[str, tuple[str, Carded]] = field(default_factory=dict)
    cards: set[str] = field(default_factory=set)
    asked_since: dict[str, dict[str, Any]] = field(default_factory=dict)
    recorded: set[str] = field(default_factory=set)  # comment ids recorded (`record`)
    on_forge: set[str] = field(default_factory=set)  # the ids of the item's comments there
    tried: set[str] = field(default_factory=set)  # the card's answers replayed as ticks

    def principal(self, name: str) -> str:
        """An author or a mention as the app wrote it: an agent's principal, else a login. A
        principal the office does not have is none the app would write: `_Foreign`."""
        name = name.removeprefix("@")
        if name == "agent" and (holder := claim_unnamed(self.item, [])) is not None:
            return holder  # a claim holder the forge may not name (`Comments._named_as`)
        kind, _, who = name.partition(":")
        if kind in ("agent", "human"):
            found = self.office.agent(who) if kind == "agent" else self.office.human(who)
            if found is None:
                raise _Foreign(name)
            return found.principal
        return _principal(self.office, name)

    def reached(self, names: str | None) -> list[Reached]:
        out = []
        for name in (names or "").split(", "):
            if name.strip():
                p = self.principal(name.strip())
                out.append(Reached(p, "agents" if p.startswith("agent:") else "personal"))
        return out

    async def claim(self, author: str) -> str | None:
        """The claim `author`'s comments took live (`Comments.add`): `views.claim_seen`, their
        access asked of the forge as live asks it."""
        if author not in self.claims:
            viewer = Viewer(self.visibility, self.forge, self.office, author)
            self.claims[author] = await claim_seen(self.item, viewer)
        return self.claims[author]

    async def table(self, author: str) -> Table:
        item = self.item
        return Table(item.kind, item.author if item.kind == "plan" else None,
                     await self.claim(author))

    def record(self, cid: str, author: str, body: str, thread: db.ThreadRow, *,
               kind: str, forge_id: int | None, at: float, parent: str | None,
               reached: list[Reached], to: list[Reached], cc: list[Reached],
               option: str | None = None, amend: bool = False,
               confirmed: bool = False, edited: float | None = None,
               before: tuple[str, ...] = ()) -> None:
        """Record a comment and its thread as it leaves it (`before`: whom the thread waited
        on before it), past the loop guard as live took it (`Comments.add`)."""
        if cid in self.recorded:  # one forge comment is one comment, however it was read: a
            return  # second reading (never expected) is not a failed rebuild of the office
        self.recorded.add(cid)
        spell = [r.principal.removeprefix("human:") for r in to]
        where = loop_guard.conversation(thread.id, parent)
        guard = loop_guard.held(author, loop_guard.hops(
            c.author for c in reversed(self.comments)
            if loop_guard.counts_in(where, c.thread, c.parent)))
        if guard:
            thread = replace(thread, state=loop_guard.no_agents_turn(before, thread.state))
        self.comments.append(db.CommentRow(cid, self.item.ref, thread.id, parent, author, body, {
            "to": spell, "cc": [r.principal.removeprefix("human:") for r in cc], "kind": kind,
            "option": option, "amend": amend, "confirmedWithPerson": confirmed,
            "notify": [r.as_json() for r in reached],
            "addressed": [r.principal for r in [*to, *cc]],
            **({"loopGuard": guard} if guard else {})}, forge_id, at, edited))
        self.threads[thread.id] = thread

    # -- the app's comments -------------------------------------------------------------
    def read_card(self, cid: str, text: str) -> None:
        """What a card (sealed) says before its item's comments are replayed: that it is a
        question's (so a hand comment with its id is the `/ask` it was posted for) and which
        comment gave each answer it shows."""
        self.cards.add(cid)
        for entry in _carded(_card_parts(text)[3]):
            if entry.mark is not None:
                self.gave[entry.mark.comment] = (cid, entry)

    async def card(self, cid: str, posted: dict[str, Any], text: str, at: float) -> None:
        lines = text.split("\n")
        head, header, rest, status = _card_parts(text)
        if head is None:
            return
        asker = self.principal(head["author"])
        options, context, body_lines = [], None, []
        fold = rest.index(_FOLD) if _FOLD in rest else None
        # (a fold with no end after it is the question's words: the card's has one)
        close = next((i for i in range(fold + 2, len(rest)) if rest[i] == "</details>"),
                     None) if fold is not None else None
        for line in rest:
            if (m := _OPTION.match(line)) is not None:
                options.append(Option(_written(m["label"]), _written(m["description"] or ""),
                                      recommended=bool(m["rec"])))
        if fold is not None and close is not None:
            context = _written("\n".join(rest[fold + 2:close - 1]))
            body_lines = rest[:fold]
        else:
            body_lines = [line for line in rest if not _OPTION.match(line)]
        question = Question(_written("\n".join(body_lines).strip("\n")), options=tuple(options),
                            header=header, human_only=bool(head["human"]), context=context)
        to, cc = self.reached(head["who"]), self.reached(head["cc"])
        table = table_reach(await self.table(asker))
        try:
            state = start(asker, question=question, to=to, cc=cc, reached=table)
        except VaultmailError:
            return
        reached = audience(self.office, author=asker, candidates=[*table, *to, *cc],
                           explicit=[*(r.principal for r in [*to, *cc]), *state.waiting_on])
        row = db.ThreadRow(cid, self.item.ref, scope_of(self.item), state,
                           int(posted["id"]), str(posted.get("body") or ""), None, at)
        body, edited = self.ask_now(cid, question)
        self.record(cid, asker, body, row, kind="question",
                    forge_id=self.asks.get(cid, int(posted["id"])), at=at, parent=None,
                    reached=reached, to=to, cc=cc, edited=edited)
        self.answers[cid] = _carded(status)
        if not any(entry.mark for entry in self.answers[cid]):
            self.ticked(row, status, lines)
        if "*Resolved.*" in status:
            self.resolved.add(cid)

    def ask_now(self, cid: str, question: Question) -> tuple[str, float | None]:
        """The words of the question's comment as live shows them, and since when they are
        edited: its question's; or, for an `/ask` a person edited since (`asked_since`), its
        words now, as an edit leaves them live (`Comments.forge_edited`). The app edits an
        `/ask` itself to take its options' `then` out (`handlers.items.comment_on_item`), an
        edit live never reads back: one that still asks the question asked is that one."""
        posted = self.asked_since.get(cid)
        if posted is None:
            return question.body, None
        text = str(posted.get("body") or "").replace("\r\n", "\n")
        ask = {c.name: c for c in parse_commands(text)}.get("ask")
        try:
            still = ask is not None and \
                render.parse_ask(ask.args, ask.body).body.strip() == question.body.strip()
        except VaultmailError:
            still = False
        words = render.edited_words(text)
        if still or words is None:  # (too long to read: live kept the question's words)
            return question.body, None
        return words.strip()[:MAX_BODY], forge_time(posted.get("updated_at"))

    def ticked(self, row: db.ThreadRow, status: list[str], lines: list[str]) -> None:
        """A card from before marks showing an answer none of its comments gave: a tick (no
        comment of its own). A marked card says which of its answers they are
        (`carded_ticks`)."""
        if not status or (m := _ANSWERED.match(status[0])) is None:
            return
        box = next((o for line in lines if (o := _OPTION.match(line)) and o["mark"] == "x"), None)
        if box is None:
            return
        # its id from the card and the tick, so a second rebuild finds it indexed
        seed = f"{row.id}\ntick\n{m['login']}\n{box['n']}"
        cid = "c" + hashlib.sha256(seed.encode()).hexdigest()[:32]
        self.ticks.append((row.id, self.principal(m["login"]), int(box["n"]) - 1, cid))

    async def tool_comment(self, cid: str, posted: dict[str, Any], text: str, at: float) -> None:
        await self.ticks_before(cid)
        lines = text.split("\n")
        head = _COMMENT_HEAD.match(lines[1]) if len(lines) > 1 else None
        if head is None:
            return
        author = self.principal(head["author"])
        body = _written("\n".join(lines[3:]).strip("\n"))
        mentioned = self.reached(head["mentions"])
        note = as_written(head["note"] or "")
        option = note.removeprefix("answer: ") if note.startswith("answer: ") else None
        await self.reply_or_start(cid, author, body, head["thread"], at=at,
                                  forge_id=int(posted["id"]), option=option,
                                  amend=note == "changed the answer", mentioned=mentioned)

    def on_card(self, thread: str, state: ThreadState, *, hand: bool) -> bool:
        """Whether the answer `state` has now is the next one the question's card shows (the
        replay then moves past it). The card, sealed, is the app's record of every answer it
        took, in order, and of the comment that gave each (its mark); the forge does not say
        when a question was resolved (by a tool) and reopened, so a hand `/answer` written
        while it was resolved (refused then) reads like any other, as does the same answer
        written twice, once refused. One the card does not show, past those met, was not
        taken (`hand`: left out; an answer the app posted, or a tick the card shows, is taken
        all the same)."""
        shown = self.answers.get(thread)
        if shown is None or state.answer is None:
            return True
        forms = self.forms(state.answer)
        start_at = self.met.get(thread, 0)
        given = state.answer.comment
        at = next((i for i in range(start_at, len(shown)) if shown[i].line in forms
                   and (shown[i].mark is None or shown[i].comment == given)), None)
        if at is None:
            return not hand
        self.met[thread] = at + 1
        return True

    async def ticks_before(self, cid: str) -> None:
        """Before comment `cid` is read, the ticks its card shows before the answer it gave."""
        if (named := self.gave.get(cid)) is not None and named[0] in self.threads:
            await self.carded_ticks(named[0], cid)

    async def carded_ticks(self, thread: str, cid: str | None) -> None:
        """The answers `thread`'s card shows before the one comment `cid` gave (all left, for
        None) that no comment on the forge gave, as the app wrote it: ticks (and an answer
        whose comment a person edited, which the app wrote), each replayed in its place,
        under the id and in the words the card shows, as its tick was live."""
        shown = self.answers.get(thread) or []
        start = self.met.get(thread, 0)
        end = len(shown) if cid is None else \
            next((i for i in range(start, len(shown)) if shown[i].comment == cid), start)
        for entry in shown[start:end]:
            mark, t = entry.mark, self.threads[thread]
            q = t.state.question
            if mark is None or mark.comment in self.on_forge or mark.comment in self.tried \
                    or q is None or (m := _ANSWERED.match("**Answered** by " + entry.line)) \
                    is None or (mark.option is not None
                                and not 0 < mark.option <= len(q.options)):
                continue
            self.tried.add(mark.comment)
            try:
                who = self.principal(m["login"])
            except _Foreign:
                continue
            option = q.options[mark.option - 1].label if mark.option is not None else None
            words = self.card_words(entry.line, who, option, relayed=mark.relayed,
                                    cid=mark.comment)
            if words is not None:
                await self.reply_or_start(mark.comment, who, words, thread, at=t.updated_at,
                                          forge_id=None, option=mark.option,
                                          confirmed=mark.relayed,
                                          amend=t.state.answer is not None)

    def forms(self, answer: Answer) -> set[str]:
        """An answer as its card may name it: its answerer by name, or as "agent" (a claim
        holder the forge may not name)."""
        holder = claim_unnamed(self.item, [])
        return {render.answer_line(answer, render.card_logins(self.office, hidden))
                for hidden in (None, holder)}

    # -- replaying ----------------------------------------------------------------------
    async def reply_or_start(self, cid: str, author: str, body: str, parent: str | None, *,
                       at: float, forge_id: int | None, option: str | int | None = None,
                       amend: bool = False, confirmed: bool = False,
                       mentioned: list[Reached] | None = None,
                       to: list[Reached] | None = None, cc: list[Reached] | None = None,
                       edited: float | None = None, hand: bool = False,
                       shown: str | None = None) -> None:
        """`shown`: the comment's words as the forge shows them, where they are not `body`
        (the words of its answer): an answer's comment edited since."""
        if parent is None:
            table = table_reach(await self.table(author))
            if to is None:  # a tool call's comment: those it mentions beyond the table
                to = [r for r in mentioned or [] if r.principal not in
                      {t.principal for t in table}]
            cc = cc or []
            state = start(author, question=None, to=to, cc=cc, reached=table)
            reached = audience(self.office, author=author, candidates=[*table, *to, *cc],
                               explicit=[r.principal for r in [*to, *cc]])
            row = db.ThreadRow(cid, self.item.ref, scope_of(self.item), state,
                               None, None, None, at)
            self.record(cid, author, body, row, kind="comment", forge_id=forge_id, at=at,
                        parent=None, reached=reached, to=to, cc=cc, edited=edited)
            return
        t = self.threads.get(parent)
        if t is None:
            return
        if to is None:  # a tool call's reply: those it mentions who were not in the thread
            to = [r for r in mentioned or [] if r.principal not in t.state.members]
        cc = cc or []
        q = t.state.question
        try:
            index = q.option_index(option) if option is not None and q else None
            state, kind = reply(t.state, self.office, author, comment=cid, at=at, body=body,
                                option=index, amend=amend, confirmed=confirmed, to=to, cc=cc)
        except VaultmailError:  # refused when it was written: never indexed then either
            return
        if kind in ("answer", "amend") and not self.on_card(t.id, state, hand=hand):
            return  # a hand answer the card never showed: refused when it was written
        reached = audience(self.office, author=author,
                           candidates=[Reached(p, w) for p, w in state.members.items()],
                           explicit=[*(r.principal for r in [*to, *cc]), *state.waiting_on])
        answered = at if kind in ("answer", "amend") else t.answered_at
        answer = state.answer if kind in ("answer", "amend") else None
        self.record(cid, author, body if shown is None else shown,
                    replace(t, state=state, answered_at=answered, updated_at=at),
                    kind=kind, forge_id=forge_id, at=at, parent=parent, reached=reached,
                    to=to, cc=cc, option=answer.option if answer else None, amend=amend,
                    confirmed=confirmed, before=t.state.waiting_on, edited=edited)

    async def hand_comment(self, posted: dict[str, Any], at: float) -> None:
        """A comment someone wrote on the forge, read as `handlers.items.comment_on_item`
        read it, with its rights (`Comments._check_writer`): without write access, only a
        reply in a question's thread that may have it. One a card names is what the card
        says it was, whatever it says now: the `/ask` the card was posted for, or an answer
        the app took (`given`). Any other the forge shows edited since it was written is
        words alone, as an edit was live (`handlers.items.index_edited`): what it says now may
        not be its author's, and what it said then the forge no longer has."""
        text = str(posted.get("body") or "").replace("\r\n", "\n")
        login = str((posted.get("user") or {}).get("login") or "ghost")
        actor = _principal(self.office, login)
        forge_id = int(posted["id"])
        cid = Comments._new_id(self.item, forge_id)
        edited = edited_since_written(posted)
        await self.ticks_before(cid)
        if cid in self.cards:  # the `/ask` its card was posted for (its id is the card's)
            self.asks[cid] = forge_id
            if edited:
                self.asked_since[cid] = posted
            return
        if cid in self.gave and await self.given(cid, actor, posted, text, at, edited=edited):
            return
        if edited:
            # (one too long to read, `words` None, is no comment: as live refuses it when its
            # `created` comes edited, `handlers.items.index_edited`)
            if login.lower() in self.writers and \
                    (words := render.edited_words(text)) is not None:
                await self.reply_or_start(cid, actor, words, None, at=at, forge_id=forge_id,
                                          to=[], cc=[],
                                          edited=forge_time(posted.get("updated_at")))
            return
        commands = {c.name: c for c in parse_commands(text)}
        if "mail" in commands:
            return
        claim = await self.claim(actor)
        try:
            addressed = render.parse_addressing(text)
            to = resolve(self.office, _entries(self.office, addressed.to), author=actor,
                         claim=claim, field="to")
            cc = resolve(self.office, _entries(self.office, addressed.cc), author=actor,
                         claim=claim, field="cc")
        except VaultmailError:
            return
        if "ask" in commands:  # its card, posted next, is the question
            self.asks[cid] = forge_id
            return
        cmd = answering(commands) or commands.get("reply")
        writer = login.lower() in self.writers
        if cmd is None and not writer:
            return
        if cmd is None:
            if "resolve" not in commands:
                await self.reply_or_start(cid, actor, addressed.body or text, None, at=at,
                                          forge_id=forge_id, to=to, cc=cc)
            return
        # the thread and the option or words, as live aimed them (`forge_commands`): a
        # refusal then is nothing indexed now
        threads = list(self.threads.values())
        try:
            aimed = aim_reply(self.office, actor, self.item.ref, threads, cmd) \
                if cmd.name == "reply" else \
                aim_answer(self.office, actor, self.item.ref, threads, cmd)
        except VaultmailError:
            return
        t = aimed.thread
        if not writer and not may_reply(t.state, self.office, actor):
            return
        if not aimed.body and aimed.option is None:
            return  # (refused live: nothing to say)
        confirmed = "confirmed" in commands and cmd.name != "reply"
        answers = cmd.name != "reply" and may_answer(t.state, self.office, actor,
                                                     confirmed=confirmed)
        await self.reply_or_start(cid, actor, aimed.body, t.id, at=at, forge_id=forge_id,
                                  option=aimed.option, confirmed=confirmed, to=to, cc=cc,
                                  amend=answers and t.state.answer is not None, hand=True)

    async def given(self, cid: str, actor: str, posted: dict[str, Any], text: str,
                    at: float, *, edited: bool) -> bool:
        """A hand comment whose card (sealed) shows it gave one of its answers: that answer,
        in its place among the card's, whatever the comment says now. Live an edit answers
        nothing and changes no answer, so an `/answer` fixed for a typo, or rewritten by
        someone with write access, answered what the card says; and one the card does not
        name answers nothing, as before. Its words in full where the forge shows the
        comment as written and they are the words the card shows (the card shows their
        first line); else the card's, and the comment reads as the forge shows it, edited,
        addressing no one (as an edit left it live). False where the card's answer is not
        this comment's to give (its question not rebuilt, or the card naming another)."""
        question, entry = self.gave[cid]
        t = self.threads.get(question)
        mark = entry.mark
        if t is None or mark is None or (q := t.state.question) is None or \
                (mark.option is not None and not 0 < mark.option <= len(q.options)):
            return False
        option = q.options[mark.option - 1].label if mark.option is not None else None
        words = self.card_words(entry.line, actor, option, relayed=mark.relayed, cid=cid)
        if words is None:
            return False
        to: list[Reached] = []
        cc: list[Reached] = []
        now = render.edited_words(text)  # (None: too long to read, its words kept live)
        shown = now.strip()[:MAX_BODY] if now is not None else None
        stamp = forge_time(posted.get("updated_at")) if now is not None else None
        if not edited and (written := await self.as_it_came(actor, text, t)) is not None:
            aimed, to, cc = written
            said = Answer(cid, actor, 0.0, option=option, body=aimed.body,
                          confirmed_with_person=mark.relayed,
                          person=person_of(self.office, actor) if mark.relayed else None)
            if aimed.option == mark.option and entry.line in self.forms(said):
                words, shown, stamp = aimed.body, aimed.body, None
            else:
                to, cc = [], []
        await self.reply_or_start(cid, actor, words, t.id, at=at, forge_id=int(posted["id"]),
                                  option=mark.option, confirmed=mark.relayed, to=to, cc=cc,
                                  amend=t.state.answer is not None, hand=True, shown=shown,
                                  edited=stamp)
        return True

    def card_words(self, line: str, actor: str, option: str | None, *, relayed: bool,
                   cid: str) -> str | None:
        """The words of `actor`'s answer the card's `line` shows (their first line), as their
        writer wrote them: the line is `render.answer_line` of that answer, so what follows
        that of the same answer without words is theirs. None: the line is not `actor`'s."""
        person = person_of(self.office, actor) if relayed else None
        for words in ("", "\n"):  # none, and some: the line up to where they start
            probe = Answer(cid, actor, 0.0, option=option, body=words,
                           confirmed_with_person=relayed, person=person)
            for form in self.forms(probe):
                if words == "" and line == form and option is not None:
                    return ""
                if words and line.startswith(form) and len(line) > len(form):
                    return as_written(line[len(form):])
        return None

    async def as_it_came(self, actor: str, text: str, t: db.ThreadRow
                         ) -> tuple[Aimed, list[Reached], list[Reached]] | None:
        """An `/answer` (or `/confirmed`) to `t` as live read it when it came: its option or
        words and whom its `to:`/`cc:` lines address. None where it reads as none now."""
        commands = {c.name: c for c in parse_commands(text)}
        cmd = answering(commands)
        if cmd is None:
            return None
        try:
            addressed = render.parse_addressing(text)
            claim = await self.claim(actor)
            to = resolve(self.office, _entries(self.office, addressed.to), author=actor,
                         claim=claim, field="to")
            cc = resolve(self.office, _entries(self.office, addressed.cc), author=actor,
                         claim=claim, field="cc")
            return aim_answer(self.office, actor, self.item.ref, [t], cmd), to, cc
        except VaultmailError:
            return None


@dataclass(frozen=True)
class Carded:
    """An answer a card shows: as `render.answer_line` writes it, and its mark, if any."""

    line: str
    mark: render.AnswerMark | None

    @property
    def comment(self) -> str | None:
        return self.mark.comment if self.mark is not None else None


def _card_parts(text: str) -> tuple[re.Match[str] | None, str | None, list[str], list[str]]:
    """A card's head, header, the lines of its question and options, and its status."""
    lines = text.split("\n")
    head = _CARD_HEAD.match(lines[1]) if len(lines) > 1 else None
    rest = lines[3:]
    header = None
    if rest and rest[0].startswith("### "):
        header, rest = _written(rest[0][4:]), rest[2:]
    # the status is the card's last part, and only its first line starts as one does: a line
    # of the question's words (data, above it) may start so too
    end = next((i for i in range(len(rest) - 1, -1, -1) if rest[i].startswith(_STATUS)),
               len(rest))
    return head, header, rest[:end], rest[end:]


def _carded(status: list[str]) -> list[Carded]:
    """The answers a card's status shows (`render._answer_status`), oldest first, each as
    `render.answer_line` writes it, with the mark naming its comment; one withdrawn has no
    comment left on the forge to meet."""
    now = [line.removeprefix("**Answered** by ") for line in status
           if line.startswith("**Answered** by ")]
    before = [line.removeprefix("- changed from ") for line in status
              if line.startswith("- changed from ")]
    return [Carded(*render.answer_mark(line)) for line in [*reversed(before), *now]]


def _principal(office: Office, login: str) -> str:
    """The office principal a forge login acts as, `forge:<login>` outside the office."""
    who = office.by_login(login)
    return who.principal if who is not None else f"forge:{login}"


def _entries(office: Office, raw: list[str]) -> list[str]:
    """Forge spellings as `to` entries (as `handlers.items.office_entries` reads them)."""
    out: list[str] = []
    for entry in raw:
        if not entry.startswith("@"):
            out.append(entry)
        elif "/" in entry:
            org, _, team = entry[1:].partition("/")
            if org.lower() == office.org.lower() and team in office.teams:
                out.append(f"team:{team}")
        elif (who := office.by_login(entry[1:])) is not None:
            out.append(who.principal.removeprefix("human:"))
    return list(dict.fromkeys(out))


class _Foreign(Exception):
    """A principal the office does not have, in one of the app's comments."""


async def replay(forge: Forge, office: Office, item: Item, *, app_login: str,
                 key: bytes, visibility: Visibility,
                 comments: list[dict[str, Any]] | None = None,
                 copied: frozenset[str] = frozenset()) -> _Replay:
    """The item's comments (`comments`, where listed already), in forge order, through the
    thread rules. The app's comments and cards are taken only as the app wrote them on this
    item: sealed (`render.opened`, with the office's `key` and the item's issue), or, from
    before comments were sealed, never edited; any other is left out (`skipped`), as is one
    naming a principal the office does not have, and one whose v1 seal (which names no item)
    is among `copied`: the same text found on another item too (`rebuild`)."""
    done = _Replay(office, item, forge, visibility)
    if comments is None:
        comments = await forge.list_comments(item.repo, item.number)
    for login in {str((c.get("user") or {}).get("login") or "").lower() for c in comments}:
        if login and login != app_login.lower() and \
                await forge.permission(item.repo, login) in CONTRIBUTOR:
            done.writers.add(login)
    # the app's comments as it wrote them, and what its cards say, before any is replayed: a
    # hand comment a card names (its `/ask`, an answer it gave) comes before its card or is
    # edited since, and is read as the card says
    own: dict[int, tuple[re.Match[str], str | None]] = {}
    for posted in comments:
        first = str(posted.get("body") or "").split("\n", 1)[0].strip()
        by = str((posted.get("user") or {}).get("login") or "")
        if by.lower() != app_login.lower():
            done.on_forge.add(Comments._new_id(item, int(posted["id"])))
            continue
        if (m := _MARKER.match(first)) is None or m["kind"] not in (None, " kind=question"):
            continue  # (where the app finds its own markers)
        read = render.opened(str(posted.get("body") or ""), key, item.forge_id)
        opened, sealed = read.text, read.holds
        trusted = not (sealed is False or (sealed is None and edited_since_written(posted))
                       or read.v1 in copied)
        if read.v1 in copied:
            done.copied.append(int(posted["id"]))
        own[int(posted["id"])] = (m, opened if trusted else None)
        if trusted:
            done.on_forge.add(m["id"])
        if trusted and m["kind"] is not None:
            done.read_card(m["id"], opened)
    for posted in comments:
        at = parse_time(str(posted.get("created_at") or time.time()))
        if (mine := own.get(int(posted["id"]))) is None:
            by = str((posted.get("user") or {}).get("login") or "")
            if by.lower() != app_login.lower():
                await done.hand_comment(posted, at)
            continue
        m, text = mine
        try:
            if text is None:
                raise _Foreign("edited")
            if m["kind"] is None:
                await done.tool_comment(m["id"], posted, text, at)
            else:
                await done.card(m["id"], posted, text, at)
        except _Foreign:
            done.skipped.append(int(posted["id"]))
    for thread in list(done.answers):
        await done.carded_ticks(thread, None)
    for thread, who, option, cid in done.ticks:
        t = done.threads[thread]
        q = t.state.question
        if q is not None and (t.state.answer is None
                              or t.state.answer.option != q.options[option].label):
            await done.reply_or_start(cid, who, "", thread, at=t.updated_at, forge_id=None,
                                      option=option + 1, amend=t.state.answer is not None)
    for thread in done.resolved & done.threads.keys():
        t = done.threads[thread]
        done.threads[thread] = replace(t, state=replace(t.state, resolved=True))
    return done


async def rebuild(store: Store, forge: Forge, office: Office, *, app_login: str, key: bytes,
                  listed: dict[str, list[dict[str, Any]]] | None = None) -> WorkReport:
    """Fill the index in from the forge: every item in the office's repositories (those the
    app's installation reaches in its org) and what was said on it. `key`: the office's
    comment key (`keys.comment_key`). `listed`: the issues of repositories already listed
    (the mail's scan of the vaults), not listed again."""
    report = WorkReport()
    items: dict[str, Item] = {}
    issue_of: dict[str, dict[str, Any]] = {}
    prefix = office.org.lower() + "/"
    for repo in sorted(r for r in await forge.list_installation_repos()
                       if r.lower().startswith(prefix)):
        issues = (listed or {}).get(repo.lower())
        if issues is None:
            issues = [issue async for issue in forge.iter_issues(repo, state="all")]
        for issue in issues:
            item = item_from_issue(office, repo, issue)
            if item is not None:
                items[item.ref], issue_of[item.ref] = item, issue
    writes: dict[tuple[str, str], bool] = {}
    for ref, item in sorted(items.items()):
        items[ref] = await _linked(store, forge, item, issue_of[ref], writes)
    for ref, item in sorted(items.items()):  # a plan's or evidence's claim is its outcome's
        parent = items.get(item.parent or "")
        if item.kind in ("plan", "evidence") and parent is not None and parent.kind == "outcome":
            items[ref] = replace(item, claim=parent.claim)
    report.items = len(items)
    now = time.time()
    visibility = Visibility()  # who may see an outcome, for the claim each writer took
    # A v1 seal (from before seals named their issue) holds on any item: the same text on
    # two items is a copy on one of them, and which cannot be told, so none is taken. An item
    # with one waits for all the office's items to be listed; the others are written at once
    deferred: list[tuple[Item, list[dict[str, Any]]]] = []
    v1_on: dict[str, set[str]] = {}  # a v1 seal's MAC -> the items it is on
    for item in items.values():
        if await db.get_item(store, item.ref) is None:
            async with store.transaction() as tx:
                await db.put_item(tx, item)
        comments = await forge.list_comments(item.repo, item.number)
        seals = _v1_seals(comments, app_login=app_login, key=key)
        if seals:
            for mac in seals:
                v1_on.setdefault(mac, set()).add(item.ref)
            deferred.append((item, comments))
            continue
        await _write(store, office, report, now, await replay(
            forge, office, item, app_login=app_login, key=key, visibility=visibility,
            comments=comments))
    copied = frozenset(mac for mac, on in v1_on.items() if len(on) > 1)
    for item, comments in deferred:
        await _write(store, office, report, now, await replay(
            forge, office, item, app_login=app_login, key=key, visibility=visibility,
            comments=comments, copied=copied))
    return report


def _v1_seals(comments: list[dict[str, Any]], *, app_login: str, key: bytes) -> set[str]:
    """The MACs of the holding v1 seals on the app's comments in `comments`."""
    out: set[str] = set()
    for posted in comments:
        if str((posted.get("user") or {}).get("login") or "").lower() != app_login.lower():
            continue
        if (mac := render.opened(str(posted.get("body") or ""), key, None).v1) is not None:
            out.add(mac)
    return out


async def _write(store: Store, office: Office, report: WorkReport, now: float,
                 done: _Replay) -> None:
    """What the replay of one item found that the index lacks, into the index."""
    item = done.item
    report.skipped += [f"{item.ref} comment {forge_id}" for forge_id in done.skipped]
    report.copied += [f"{item.ref} comment {forge_id}" for forge_id in done.copied]
    have = await db.comments_by_ids(store, [c.id for c in done.comments])
    behind: set[str] = set()  # threads given a comment the index lacked
    for c in done.comments:
        if c.id in have:
            continue
        report.comments += 1
        behind.add(c.thread)
        async with store.transaction() as tx:
            await db.put_comment(tx, c)
            for r in sorted(c.data["notify"], key=lambda r: owner_of(office, r["principal"])):
                owner = owner_of(office, r["principal"])
                box = "you" if r["way"] == "personal" else "agents"
                await db.deliver(tx, owner, box, r["principal"], c.id, org=office.org,
                                 read_at=now)
                report.deliveries += 1
    for t in done.threads.values():
        known = await db.get_thread(store, t.id)
        if known is None:
            async with store.transaction() as tx:
                await db.put_thread(tx, t)
            report.questions += t.state.is_question
        elif t.id in behind:  # the index is older than the forge: it takes the replay
            await db.swap_thread(store, known, _caught_up(known, t))


async def _linked(store: Store, forge: Forge, item: Item, issue: dict[str, Any],
                  writes: dict[tuple[str, str], bool]) -> Item:
    """`item` with the parent live would have taken (`Comments._linked`): a sub-issue link
    (which takes write access to make) as the forge has it, a `Part of` line only from an
    author with write access to the item's repository (on a public one anyone may edit their
    issue's body), else the parent the index has, if any. `writes`: answers asked already."""
    if item.parent is None or native_parent(item.repo, issue) is not None:
        return item
    known = await db.get_item(store, item.ref)
    was = known.parent if known is not None else None
    if item.parent == was:
        return item
    asked = (item.repo.lower(), item.author_login.lower())
    if asked not in writes:
        writes[asked] = await forge.permission(item.repo, item.author_login) in CONTRIBUTOR
    return item if writes[asked] else replace(item, parent=was)


def _caught_up(known: db.ThreadRow, replayed: db.ThreadRow) -> db.ThreadRow:
    """The thread as replayed from the forge, which has comments `known` (the index's row)
    lacks, keeping what the index alone knew: the question with its options' `then`, and a
    resolved mark."""
    state = replace(replayed.state, question=known.state.question or replayed.state.question,
                    resolved=known.state.resolved or replayed.state.resolved)
    return replace(replayed, state=state)
