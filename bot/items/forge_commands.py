"""What a hand comment's `/answer`, `/confirmed` and `/reply` aim at, read one way for the
live handler (handlers.items) and for a rebuild from the forge (bot.items.rebuild): the
thread, and the option or words it gives. A rebuild that read them its own way took an
answer live had read as words, and lost replies live had indexed (review of issues 25/26).

Pure: given the item's open threads (resolved ones are no command's target), the office and
who wrote the comment. A refusal raises, as live refuses: a rebuild then indexes nothing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bot.digits import whole
from bot.errors import InvalidArguments, NotFoundError
from bot.items.questions import naming
from bot.items.threads import may_answer, speaks_for_asked
from bot.mail.commands import Command
from bot.office.config import Office
from bot.store.comments import ThreadRow


@dataclass(frozen=True)
class Aimed:
    thread: ThreadRow
    option: int | None  # 1-based, as written: checked against the options when recorded
    body: str


def answering(by_name: Mapping[str, Command]) -> Command | None:
    """The `/answer` (or `/confirmed`) command of a comment's commands, with the words of a
    `/confirmed <what they said>` line under an `/answer` taken in as its words."""
    cmd = by_name.get("answer") or by_name.get("confirmed")
    if cmd is not None and "answer" in by_name and "confirmed" in by_name:
        said = by_name["confirmed"]
        cmd = Command(cmd.name, cmd.args, "\n".join(
            part for part in (cmd.body, said.args, said.body) if part.strip()))
    return cmd


def named(t: ThreadRow) -> str:
    """A question as `/answer` names it: its header (else the start of its words) and id."""
    q = t.state.question
    assert q is not None
    name = f'"{q.header}"' if q.header else f'"{q.body.splitlines()[0][:60]}"'
    return f"{name} (`{t.id}`)"


def _which_question(office: Office, actor: str, ref: str, questions: list[ThreadRow],
                    words: str) -> tuple[ThreadRow, str]:
    """The question `/answer` is for, and its answer's words: the one named first (by its
    comment id or header), else the only open question on the item that asks the commenter
    (else the only one they may reply to, speaking with or for someone asked). With several,
    none is guessed: the commenter is told which are open and how to name one."""
    found = naming(words, [(t.id, t.state.question) for t in questions if t.state.question])
    if len(found) == 1:
        qid, rest = found[0]
        return next(t for t in questions if t.id == qid), rest
    if len(found) > 1:
        raise InvalidArguments(f"{len(found)} open questions on {ref} have that header; "
                               "name one by its id: `/answer <id> <your answer>` ("
                               + ", ".join(named(t) for t in questions
                                           if t.id in {qid for qid, _ in found}) + ")")
    asking = [t for t in questions if may_answer(t.state, office, actor)] or [
        t for t in questions if t.state.asker != actor
        and speaks_for_asked(t.state, office, actor)]
    if not asking:
        raise NotFoundError(f"no open question on {ref} asks {actor}; "
                            "comment in words instead")
    if len(asking) > 1:
        example = next((q.header for t in asking if (q := t.state.question) and q.header),
                       asking[0].id)
        raise InvalidArguments(
            f"{len(asking)} open questions on {ref} ask you: "
            + ", ".join(named(t) for t in asking)
            + f"; say which: `/answer <header or id> <your answer>`, e.g. `/answer {example} "
            f"{words or '2'}`")
    return asking[0], words


def aim_answer(office: Office, actor: str, ref: str, threads: Sequence[ThreadRow],
               cmd: Command) -> Aimed:
    """`/answer [<question>] <option number or words>` (or `/confirmed`): its question, and
    the option (a whole number in ASCII digits, on a question with options) or the words."""
    questions = [t for t in threads if t.state.is_question and not t.state.resolved]
    t, words = _which_question(office, actor, ref, questions, cmd.args.strip())
    option: int | None = None
    body = cmd.body.strip()
    if (number := whole(words)) is not None and t.state.question and t.state.question.options:
        option = number
    elif words:
        body = f"{words}\n{body}".strip()
    if option is None and not body:
        raise InvalidArguments("usage: `/answer <option number>` or `/answer <your words>`; "
                               "to name the question, `/answer <header or id> <your answer>`")
    return Aimed(t, option, body)


def concerns(t: ThreadRow, office: Office, who: str) -> bool:
    """A thread `who` is in: asked it, was asked, was reached by it or wrote in it."""
    return who == t.state.asker or who in t.state.members or (
        t.state.is_question and speaks_for_asked(t.state, office, who))


def aim_reply(office: Office, actor: str, ref: str, threads: Sequence[ThreadRow],
              cmd: Command) -> Aimed:
    """`/reply [<header or id>] <words>`: the thread named (any open thread by its id, a
    question by its header), else the only open thread on the item the commenter is in."""
    threads = [t for t in threads if not t.state.resolved]
    words = cmd.args.strip()
    first = words.split(maxsplit=1)
    by_id = [t for t in threads if first and first[0].strip("`") == t.id]
    found = naming(words, [(t.id, t.state.question) for t in threads
                           if t.state.question is not None])
    if by_id:
        target, words = by_id[0], first[1].strip() if len(first) > 1 else ""
    elif len(found) == 1:
        target = next(t for t in threads if t.id == found[0][0])
        words = found[0][1]
    elif len(found) > 1:
        raise InvalidArguments(f"{len(found)} open questions on {ref} have that header; "
                               "name one by its id: `/reply <id> <your words>`")
    else:
        mine = [t for t in threads if concerns(t, office, actor)]
        if not mine:
            raise NotFoundError(f"no open thread on {ref} has you in it; name one: "
                                "`/reply <header or id> <your words>`, or comment without "
                                "`/reply` to start a thread")
        if len(mine) > 1:
            raise InvalidArguments(
                f"{len(mine)} open threads on {ref} have you in it: "
                + ", ".join(named(t) if t.state.question else f"`{t.id}`" for t in mine)
                + "; say which: `/reply <header or id> <your words>`")
        target = mine[0]
    return Aimed(target, None, f"{words}\n{cmd.body.strip()}".strip())
