"""Slash commands in comments (DESIGN §3.6), parsed without I/O.

A command counts only where a reader sees it start a line of a real paragraph: the comment is
read as CommonMark (`bot.mail.markdown.paragraph_lines`), so nothing in a block quote (lazy
continuation lines included), a code fence of any length, indented code, an HTML comment or
block, or a list counts; the line itself must begin with the slash (up to three spaces before
it, as CommonMark allows), so an escaped ``\\/close`` is text. Everything a comment says is
data, so unknown words after a slash are just text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bot.mail.markdown import paragraph_lines

KNOWN = ("mail", "working", "close", "ask", "answer", "resolve")
_COMMAND = re.compile(r"^ {0,3}/(?P<name>[a-z]+)\b[ \t]*(?P<args>.*)$")


@dataclass(frozen=True)
class Command:
    name: str
    args: str
    body: str  # the lines after the command, up to the next command (for /mail and /ask)


def parse_commands(text: str) -> list[Command]:
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    found: list[tuple[int, str, str]] = []
    for i in sorted(paragraph_lines(text)):
        m = _COMMAND.match(lines[i].rstrip())
        if m and m.group("name") in KNOWN:
            found.append((i, m.group("name"), m.group("args").strip()))
    commands = []
    for k, (i, name, args) in enumerate(found):
        end = found[k + 1][0] if k + 1 < len(found) else len(lines)
        body = "\n".join(lines[i + 1:end]).strip("\n")
        commands.append(Command(name, args, body))
    return commands


def first_command(text: str) -> Command | None:
    commands = parse_commands(text)
    return commands[0] if commands else None
