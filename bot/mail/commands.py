"""Slash commands in comments (DESIGN §3.6), parsed without I/O.

A command counts only at the start of a line, outside quotes and code blocks; everything a
comment says is data, so unknown words after a slash are just text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KNOWN = ("mail", "working", "close", "ask", "answer", "resolve")
_COMMAND = re.compile(r"^/(?P<name>[a-z]+)\b[ \t]*(?P<args>.*)$")


@dataclass(frozen=True)
class Command:
    name: str
    args: str
    body: str  # the lines after the command, up to the next command (for /mail and /ask)


def _visible_lines(text: str) -> list[tuple[str, bool]]:
    """Each line with whether it may hold a command (not quoted, not in a code block)."""
    out: list[tuple[str, bool]] = []
    fence: str | None = None
    for raw in text.replace("\r\n", "\n").split("\n"):
        stripped = raw.strip()
        if fence is not None:
            out.append((raw, False))
            if stripped.startswith(fence):
                fence = None
            continue
        if stripped.startswith(("```", "~~~")):
            fence = stripped[:3]
            out.append((raw, False))
            continue
        quoted = stripped.startswith(">") or raw.startswith(("    ", "\t"))
        out.append((raw, not quoted))
    return out


def parse_commands(text: str) -> list[Command]:
    lines = _visible_lines(text)
    found: list[tuple[int, str, str]] = []
    for i, (line, live) in enumerate(lines):
        m = _COMMAND.match(line.rstrip()) if live else None
        if m and m.group("name") in KNOWN:
            found.append((i, m.group("name"), m.group("args").strip()))
    commands = []
    for k, (i, name, args) in enumerate(found):
        end = found[k + 1][0] if k + 1 < len(found) else len(lines)
        body = "\n".join(line for line, _ in lines[i + 1:end]).strip("\n")
        commands.append(Command(name, args, body))
    return commands


def first_command(text: str) -> Command | None:
    commands = parse_commands(text)
    return commands[0] if commands else None
