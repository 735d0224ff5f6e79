"""Slash commands in comments (DESIGN §3.6), parsed without I/O.

A command counts only where a reader sees it start a line of a real paragraph: the comment is
read as CommonMark (`bot.mail.markdown.paragraph_lines`), so nothing in a block quote (lazy
continuation lines included), a code fence of any length, indented code, an HTML comment or
block, or a list counts; the line itself must begin with the slash (up to three spaces before
it, as CommonMark allows), so an escaped ``\\/close`` is text. Everything a comment says is
data, so unknown words after a slash are just text.

Anyone may comment, and comments are read before anyone's rights are checked, so reading is
linear in the comment's length, and a comment longer than `MAX_TEXT` (GitHub's own limit) holds
no commands: it is not read at all, and what takes its words refuses it by its own limit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bot.mail.markdown import MAX_TEXT, paragraph_lines

KNOWN = ("mail", "working", "close", "ask", "answer", "confirmed", "reply", "resolve")
_COMMAND = re.compile(r"^ {0,3}/(?P<name>[a-z]+)\b[ \t]*(?P<args>.*)$")


@dataclass(frozen=True)
class Command:
    name: str
    args: str
    body: str  # the lines after the command, up to the next command (for /mail and /ask)


def _found(text: str) -> tuple[list[str], list[tuple[int, str, str]]]:
    """The text's lines, and its commands: (line number, name, args)."""
    if len(text) > MAX_TEXT:
        return [text], []
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    found: list[tuple[int, str, str]] = []
    for i, line in enumerate(lines):
        m = _COMMAND.match(line.rstrip())
        if m and m.group("name") in KNOWN:
            found.append((i, m.group("name"), m.group("args").strip()))
    if found:  # most comments have no line like a command: no need to read them as CommonMark
        live = paragraph_lines(text)
        found = [f for f in found if f[0] in live]
    return lines, found


def words_besides_commands(text: str) -> str:
    """What `text` says beside its commands: its lines, those of its commands taken out
    (blank when it is commands alone; a command's args are on its line, and go with it)."""
    lines, found = _found(text)
    taken = {i for i, _, _ in found}
    return "\n".join(line for i, line in enumerate(lines) if i not in taken).strip("\n")


def parse_commands(text: str) -> list[Command]:
    lines, found = _found(text)
    commands = []
    for k, (i, name, args) in enumerate(found):
        end = found[k + 1][0] if k + 1 < len(found) else len(lines)
        body = "\n".join(lines[i + 1:end]).strip("\n")
        commands.append(Command(name, args, body))
    return commands


def first_command(text: str) -> Command | None:
    commands = parse_commands(text)
    return commands[0] if commands else None
