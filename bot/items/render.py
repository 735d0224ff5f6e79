"""How comments look in the forge, and reading what people write there. Pure text in, text out.

A question card shows the header, the question, a "Context" fold and one task-list box per
option (label and description: never `then`, which is the asker's own note). Only people
reached personally are @-mentioned: the mention is what makes the forge notify them. Every text
someone else wrote (bodies, context, headers, option labels and descriptions, answers) is
posted as data (`bot.mail.markdown.as_data`: its @mentions defused, its HTML comments
disarmed, so none reads as one of the app's markers): the app's own mention list, chosen by the
reach rules, is the only live one.

What people write is read before their rights are checked (anyone may comment on a public
repository), so every reader here is linear in the text's length: no regular expression here
backtracks over what another quantifier took (a line of 30,000 spaces once took 19 s), and a
comment longer than `MAX_COMMENT` is refused before any of it is read.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass, field
from typing import Any

from bot.forge import markers
from bot.items.questions import Question
from bot.items.threads import ThreadState, left_note
from bot.mail.markdown import (
    MAX_TEXT,
    as_data,
    check_length,
    list_item_lines,
    paragraph_lines,
    visible_text,
)
from bot.names import MENTIONED
from bot.office.config import Office

_ADDRESS_LINE = re.compile(r"^\s*(?P<field>to|cc)\s*:\s*(?P<rest>.*)$", re.IGNORECASE)
_MENTION = re.compile(rf"(?<![\w/`@.])@(?P<name>{MENTIONED}(?:/[A-Za-z0-9_.-]+)?)")
# A task-list box: `- [ ] text`. The whitespace around the text is stripped afterwards:
# a lazy `.+?` before `\s*$` tried the whole tail again at each of its characters.
_TASK = re.compile(r"^\s*[-*]\s+\[(?P<mark>[ xX])\](?P<text>\s.+)")
# Each starts with a character no other part of it takes, so a search never rescans a run of
# whitespace from each of its characters (as a leading `\s+` did).
_RECOMMENDED = re.compile(r"\(recommend(?:ed)?\)", re.IGNORECASE)
_DASH = re.compile(r"(?<=\s)[—–-](?=\s)")  # an option's label — its description
# An item's comment holds at most 10,000 characters of words (bot.items.service.MAX_BODY); its
# `to:` / `cc:` lines and an /ask's header and four option lines (600 characters at most each)
# fit in the rest. A longer one is refused unread.
MAX_COMMENT = 16_000


def marker(comment_id: str, **extra: str) -> str:
    return markers.marker("comment", f"id={comment_id}", *(f"{k}={v}" for k, v in extra.items()))


def seal(text: str, key: bytes, issue: int) -> str:
    """`text` as the app posts it on the issue whose forge id is `issue`, sealed: its last line
    a keyed MAC (the office's `keys.comment_key`) of all above it, marker and meaning, and of
    that issue, so a rebuild can tell the app's own words on this item from a person's edit of
    them (`opened`), and from a copy of them on another item. The issue's forge id survives
    a rename of its repository and a transfer within the office; its number alone does not."""
    return f"{text}{markers.marker('seal', f'v2={_mac2(text, key, issue)}')}\n"


@dataclass(frozen=True)
class Opened:
    """A comment of the app's as a rebuild reads it (`opened`)."""
    text: str  # without its seal
    holds: bool | None  # the seal holds here (None: no seal, posted before comments were)
    v1: str | None = None  # a holding v1 seal's MAC: it names no item (see `rebuild`)


def opened(text: str, key: bytes, issue: int | None) -> Opened:
    """A comment of the app's as the forge shows it on the issue whose forge id is `issue`
    (None: not known, so no v2 seal holds): its text without the seal, and whether the seal
    holds. A v2 seal holds only on the issue it was written on; a v1 seal (from before seals
    named their issue) on any, so its MAC is given for the rebuild to find it on two items."""
    text = text.replace("\r\n", "\n")
    at = text.rfind("<!-- vaultmail:seal v")
    if at < 0:
        return Opened(text, None)
    inner, given = text[:at], text[at:].rstrip().encode()
    # (as bytes: the seal is anyone's to edit, and a text compare refuses what is not ASCII)
    if given.startswith(b"<!-- vaultmail:seal v1="):
        mac = _mac(inner, key)
        holds = hmac.compare_digest(given, markers.marker("seal", f"v1={mac}").encode())
        return Opened(inner, holds, mac if holds else None)
    if issue is None:
        return Opened(inner, False)
    return Opened(inner, hmac.compare_digest(
        given, markers.marker("seal", f"v2={_mac2(inner, key, issue)}").encode()))


def _mac(text: str, key: bytes) -> str:
    # over the text as a forge may hand it back: its line ends and trailing blanks aside
    data = text.replace("\r\n", "\n").rstrip().encode()
    return hmac.new(key, data, hashlib.sha256).hexdigest()


def _mac2(text: str, key: bytes, issue: int) -> str:
    # under a key of its own (no v1 MAC of any text is a v2 one), the issue before the text
    own = hmac.new(key, b"vaultmail comment seal v2", hashlib.sha256).digest()
    return _mac(f"{int(issue)}\n{text}", own)


def _neutralise(text: str) -> str:
    """Keep data from forging option boxes or mentions inside the app's own comment."""
    out = []
    for line in as_data(text).splitlines():
        if _TASK.match(line):
            line = line.replace("[", "\\[", 1)
        out.append(line)
    return "\n".join(out)


def mention_list(logins: list[str]) -> str:
    return ", ".join(f"@{login}" for login in logins)


def render_comment(comment_id: str, *, author: str, body: str, mentions: list[str],
                   thread: str | None, note: str = "") -> str:
    head = f"💬 **{author}**"
    if thread:
        head += f" replied in thread `{thread}`"
    if note:
        head += f" ({as_data(note)})"
    if mentions:
        head += f" · for {mention_list(mentions)}"
    return f"{marker(comment_id)}\n{head}\n\n{_neutralise(body)}\n"


def option_line(i: int, q: Question, ticked: bool) -> str:
    o = q.options[i]
    text = f"**{as_data(o.label)}**" + (" (recommended)" if o.recommended else "")
    if o.description:
        text += f" — {as_data(o.description)}"
    return f"- [{'x' if ticked else ' '}] {i + 1}. {text}"


def render_card(comment_id: str, *, author: str, state: ThreadState, mentions: list[str],
                logins: dict[str, str], asked: list[str] | None = None,
                hidden: str | None = None) -> str:
    """The card; `mentions` are the logins it @mentions, `asked` the logins of those it asks
    (the rest of `mentions`, reached but not asked, follow "cc"); `hidden`, a claim holder
    the forge may not name (`views.claim_unnamed`), is asked as "agent", unmentioned: what
    its author wrote (`to: agent`), which a rebuild from the forge reads back as the holder
    (`bot.items.rebuild`), and no one's name."""
    q = state.question
    assert q is not None
    people = {m.lower() for m in mentions}
    shown = [m for m in (asked or []) if m.lower() in people] if asked is not None \
        else mentions
    others = [m for m in mentions if m.lower() not in {a.lower() for a in shown}]
    unnamed = ["agent"] if hidden is not None and hidden in state.asked else []
    if asked is not None and not shown and not unnamed:
        shown, others = others, []  # asked nobody it mentions: as before, all mentioned
    # (asked nobody it can mention: those asked by name, one who left by the name they had)
    named = [mention_list(shown)] if shown else []
    who = ", ".join([*named, *unnamed]) or ", ".join(state.left.get(p) or logins.get(p, p)
                                                     for p in state.asked)
    head = f"❓ **Question** from **{author}** for {who}"
    if others:
        head += f" · cc {mention_list(others)}"
    if q.human_only:
        head += " · *a person decides (human only)*"
    parts = [marker(comment_id, kind="question"), head, ""]
    if q.header:
        parts += [f"### {as_data(q.header)}", ""]
    if not q.body:  # deleted on the forge: nothing of what it asked is repeated, but its
        # header (the name `/answer` knew it by)
        return "\n".join([*parts, _status(state, logins, hidden)]) + "\n"
    parts += [_neutralise(q.body), ""]
    if q.context:
        parts += ["<details><summary>Context</summary>", "", _neutralise(q.context), "",
                  "</details>", ""]
    chosen = None
    if state.answer and state.answer.option:
        chosen = next(i for i, o in enumerate(q.options) if o.label == state.answer.option)
    for i in range(len(q.options)):
        parts.append(option_line(i, q, i == chosen))
    if q.options:
        parts.append("")
    parts.append(_status(state, logins, hidden))
    return "\n".join(parts) + "\n"


def card_logins(office: Office, hidden: str | None = None) -> dict[str, str]:
    """How a card names each principal: a person by login, an agent by its principal, and
    `hidden` (a claim holder the forge may not name) as the `to` entry that reaches it."""
    people = {h.principal: h.login for h in office.humans}
    agents = {a.principal: a.principal for a in office.agents}
    return people | agents | ({hidden: "agent"} if hidden else {})


def answer_line(a: Any, logins: dict[str, str]) -> str:
    """An answer as its card names it, after "**Answered** by " or "- changed from ": the
    rebuild matches the answers it replays against these (bot.items.rebuild)."""
    return _said(a, logins)


@dataclass(frozen=True)
class AnswerMark:
    """What a card records, hidden after each answer it shows, of the answer the app took:
    the comment that gave it, the option it chose (its number) and whether an agent relayed
    its person's answer. The forge keeps a person's comment only as last edited, and an
    edit answers nothing (`handlers.items.words_edited`): the card, sealed, is what a rebuild
    takes an answer from (`bot.items.rebuild`), whatever its comment says now."""

    comment: str
    option: int | None = None  # 1-based
    relayed: bool = False


_COMMENT_ID = re.compile(r"c[0-9a-f]{1,64}")
_ANSWER_MARK = re.compile(r" <!-- vaultmail:answer comment=(?P<comment>c[0-9a-f]{1,64})"
                          r"(?: option=(?P<option>[0-9]{1,3}))?(?P<relayed> relayed)? -->")


def _mark(a: Any, q: Question | None) -> str:
    if not _COMMENT_ID.fullmatch(a.comment):
        return ""
    number = next((i + 1 for i, o in enumerate(q.options) if o.label == a.option), None) \
        if q is not None and a.option is not None else None
    return " " + markers.marker("answer", f"comment={a.comment}",
                                *([f"option={number}"] if number is not None else []),
                                *(["relayed"] if a.confirmed_with_person else []))


def answer_mark(line: str) -> tuple[str, AnswerMark | None]:
    """A card's answer line (after "**Answered** by " or "- changed from ") as `answer_line`
    wrote it, and the mark after it, if any (cards from before marks have none). The words
    before it are data: `as_data` disarmed every `<!--` in them, so the mark is the app's."""
    at = line.rfind(" <!-- vaultmail:answer ")
    m = _ANSWER_MARK.fullmatch(line, at) if at >= 0 else None
    if m is None:
        return line, None
    option = m["option"]
    return line[:at], AnswerMark(m["comment"], int(option) if option else None,
                                 relayed=bool(m["relayed"]))


def _said(a: Any, logins: dict[str, str]) -> str:
    by = logins.get(a.by, a.by)
    what = a.option or ""
    if a.body:
        what = f"{what}: {a.body}" if what else a.body
    relay = f" (their person {logins.get(a.person, a.person)}'s answer)" \
        if a.confirmed_with_person else ""
    return f"{by}{relay}: {as_data(what.splitlines()[0]) if what else '(no words)'}"


def _earlier(a: Any, logins: dict[str, str], q: Question | None) -> str:
    if a.withdrawn:  # its words went with its comment
        return (f"- withdrawn: {logins.get(a.by, a.by)}'s answer"
                f"{f' ({as_data(a.option)})' if a.option else ''}, deleted on the forge")
    return f"- changed from {_said(a, logins)}{_mark(a, q)}"


def _status(state: ThreadState, logins: dict[str, str], hidden: str | None) -> str:
    note = left_note(state, hidden)
    if note:
        return f"*{as_data(note)}.*\n\n{_answer_status(state, logins, hidden)}"
    return _answer_status(state, logins, hidden)


def _answer_status(state: ThreadState, logins: dict[str, str], hidden: str | None) -> str:
    earlier = [_earlier(a, logins, state.question) for a in reversed(state.history)]
    if state.answer is None:
        if state.question and not state.question.body:  # its comment deleted on the forge
            return "*This question was deleted on the forge.*"
        how = ("Tick a box, or reply `/answer <number>` (or `/answer` and your own words)."
               if state.question and state.question.options
               else "Reply `/answer` and your answer.")
        if state.history and state.history[-1].withdrawn:
            # (whom it waits on, as the head says whom it asks: `hidden` as "agent")
            who = ", ".join("agent" if p == hidden else logins.get(p, p)
                            for p in state.waiting_on)
            how = ("**Answer withdrawn**: its comment was deleted on the forge. "
                   f"{f'Waiting on {who} again. ' if who else ''}{how}")
        return "\n".join([how, *earlier])
    lines = [f"**Answered** by {_said(state.answer, logins)}"
             f"{_mark(state.answer, state.question)}", *earlier]
    if state.resolved:
        lines.append("*Resolved.*")
    return "\n".join(lines)


def _item_lines(text: str) -> set[str]:
    """The first lines of the card's real list items (read as CommonMark: a box inside an
    HTML comment, a code fence or a quote is no box)."""
    lines = text.replace("\r\n", "\n").split("\n")
    return {lines[i].strip() for i in list_item_lines(text)}


def ticked_option(card: str, q: Question, new_body: str) -> int | None:
    """The option a person ticked by editing the card: a box ticked now that was not before
    (none in a body too long to read)."""
    if len(new_body) > MAX_TEXT:
        return None
    new_lines = _item_lines(new_body)
    old_lines = _item_lines(card)
    for i in range(len(q.options)):
        on = option_line(i, q, True).strip()
        if on in new_lines and on not in old_lines:
            return i
    return None


@dataclass
class Addressed:
    to: list[str] = field(default_factory=list)  # raw entries: emails, team:k, @login, ...
    cc: list[str] = field(default_factory=list)
    body: str = ""


def parse_addressing(text: str) -> Addressed:
    """`to:` / `cc:` lines at the top of a comment, and @mentions in the rest (as `to`).
    TextTooLong past `MAX_COMMENT`."""
    check_length(text, limit=MAX_COMMENT)
    lines = text.replace("\r\n", "\n").split("\n")
    live = paragraph_lines(text)  # an address line in code, a quote or HTML addresses no one
    out = Addressed()
    i = 0
    while i < len(lines):
        m = _ADDRESS_LINE.match(lines[i]) if i in live else None
        if not m:
            if lines[i].strip():
                break
            i += 1
            continue
        entries = [e for e in re.split(r"[,\s]+", m["rest"]) if e]
        (out.to if m["field"].lower() == "to" else out.cc).extend(entries)
        i += 1
    out.body = "\n".join(lines[i:]).strip("\n")
    for name in mentions(out.body):
        entry = f"@{name}"
        if entry not in out.to and entry not in out.cc:
            out.to.append(entry)
    return out


def edited_words(text: str) -> str | None:
    """What a comment says after an edit, as the index shows it (`Comments.forge_edited`):
    its words, its `to:`/`cc:` lines aside (an edit addresses no one). None for one longer
    than the app reads (`MAX_COMMENT`): an edit of it is not read, as such a comment is not
    when it comes, and its words stay those it had (a rebuild reads the same)."""
    if len(text) > MAX_COMMENT:
        return None
    return parse_addressing(text).body or text


def mentions(text: str) -> list[str]:
    """@login and @org/team outside quotes, code and HTML comments, in order, without repeats.
    TextTooLong past `MAX_COMMENT`."""
    check_length(text, limit=MAX_COMMENT)
    found: list[str] = []
    for m in _MENTION.finditer(visible_text(text)):  # read as CommonMark, as the forge does
        if m["name"] not in found:
            found.append(m["name"])
    return found


@dataclass
class Ask:
    body: str
    options: list[dict[str, Any]]
    header: str | None
    context: str | None = None
    human_only: bool = False


# An option's private note: `- [ ] Keep 30 days — … <!-- then: add dual-read … -->`. Hidden
# where the forge shows the comment, and taken out of it by the app once it is in the index.
# (no `<` inside: each try stops at the next `<`, so reading stays linear in the text)
_THEN = re.compile(r"<!--[ \t]*then[ \t]*:(?P<then>[^<]*?)-->", re.IGNORECASE)
_HUMAN_ONLY = re.compile(r"^\s*human[\s_-]*only\s*(?::\s*(?:yes|true)\s*)?$", re.IGNORECASE)


def parse_ask(args: str, body: str) -> Ask:
    """`/ask <question>` with `- [ ] label — description` lines (at most four) below.

    A `header: …` line names the card; a `context: …` line (and the lines right after it, up
    to a blank line or an option) is the background shown folded; a `human only` line says a
    person must decide; an option marked "(recommended)" is the pick, and a hidden
    `<!-- then: … -->` on its line is its `then`; other lines join the question.
    TextTooLong past `MAX_COMMENT`."""
    check_length(f"{args}\n{body}", limit=MAX_COMMENT)
    header: str | None = None
    context: list[str] | None = None
    in_context = human_only = False
    text: list[str] = [args] if args else []
    options: list[dict[str, Any]] = []
    items = list_item_lines(body)  # boxes in code, quotes or HTML are words, not options
    for i, line in enumerate(body.replace("\r\n", "\n").split("\n")):
        task = _TASK.match(line) if i in items else None
        low = line.strip().lower()
        if task:
            options.append(option_of(task["text"]))
        elif low.startswith("header:") and header is None:
            header = line.split(":", 1)[1].strip()
        elif low.startswith("context:") and context is None:
            context, in_context = [line.split(":", 1)[1].strip()], True
            continue
        elif _HUMAN_ONLY.match(line):
            human_only = True
        elif in_context and context is not None and low:
            context.append(line.strip())
            continue
        else:
            text.append(line)
        in_context = False
    said = "\n".join(context).strip() if context is not None else ""
    return Ask("\n".join(text).strip(), options, header, said or None, human_only)


def without_then(text: str) -> str:
    """The comment with its options' hidden `then` notes taken out (they live in the index)."""
    return _THEN.sub("", text)


def has_then(text: str) -> bool:
    return _THEN.search(text) is not None


def option_of(text: str) -> dict[str, Any]:
    """An /ask option from the text of its box: `label — description` (or ` - `), marked
    "(recommended)" anywhere, with a hidden `<!-- then: … -->` note. One linear pass, however
    long the text."""
    then = " ".join(m["then"].strip() for m in _THEN.finditer(text))
    text = _THEN.sub(" ", text)
    pieces = _RECOMMENDED.split(text)
    text = " ".join(p.strip() for p in pieces).strip()  # a mark and its spaces: one space
    dash = _DASH.search(text)
    label, description = (text[:dash.start()], text[dash.end():].lstrip()) if dash else (text, "")
    out = {"label": label.strip().strip("*"), "description": description.strip(),
           "recommended": len(pieces) > 1}
    return {**out, "then": then} if then else out
