"""Markdown the app reads and writes on the forge. Pure.

Text the app posts on the forge for someone else must not @-mention anyone.

The forge turns `@login` and `@org/team` into a mention (and a notification) when the `@`
starts the text or follows anything but a letter, digit or underscore, and a letter or digit
follows it. The app decides itself whom it mentions (the reach rules: who a comment reaches,
the 20-person limit, only people who can already see the item); text it copies from a tool
call, a comment or a command must add nobody. So every such text goes through
`defuse_mentions`, and the app's own mention list is rendered live next to it.

`defuse_mentions` puts a WORD JOINER (U+2060, invisible, no line break) right after such an
`@`: the text reads the same, but the forge no longer sees a login after the `@`. An `@` after
a letter or digit (`marco@acme.com`) is no mention and stays as it is. The HTML entities for
`@` (`&#64;`, `&#x40;`, `&commat;`), which the forge decodes before it looks for mentions, are
written as a defused `@` too. Applying it twice changes nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from markdown_it import MarkdownIt
from markdown_it.token import Token

from bot.errors import InvalidArguments

WORD_JOINER = "\u2060"
_ENTITY_AT = re.compile(r"&(?:#0*64|#[xX]0*40|commat);")
# Also an `@` followed by `&`: an entity there could decode to the login's first letter.
_LIVE_AT = re.compile(r"(?<![A-Za-z0-9_])@(?=[A-Za-z0-9&])")


def defuse_mentions(text: str) -> str:
    """`text` with no live @mention left in it (see the module's docstring)."""
    text = _ENTITY_AT.sub("@" + WORD_JOINER, text)
    return _LIVE_AT.sub("@" + WORD_JOINER, text)


def disarm_markers(text: str) -> str:
    """`text` with no HTML comment left in it: the app finds its own markers (`<!-- vaultmail:
    ... -->`) again in what it posted, so one in someone else's words, posted by the app,
    would read as the app's (an email's text naming where the agent's reply goes). A WORD
    JOINER inside each `<!--`: it reads the same and opens no comment. Applying it twice
    changes nothing."""
    return text.replace("<!--", "<!-" + WORD_JOINER + "-")


def as_data(text: str) -> str:
    """Someone else's words inside what the app posts: no live @mention, no marker."""
    return disarm_markers(defuse_mentions(text))


def blockquote(text: str) -> str:
    """`text` as a Markdown block quote, every line of it (`as_data` it first when it is
    someone else's)."""
    return "\n".join("> " + line for line in text.splitlines()) or ">"


def as_written(text: str) -> str:
    """Words `as_data` made safe to post on the forge, as their writer wrote them (for where
    the forge does not read them: an email)."""
    return text.replace("@" + WORD_JOINER, "@").replace("<!-" + WORD_JOINER + "-", "<!--")


# -- reading comments as CommonMark ----------------------------------------------------------
#
# What a comment *says* (its commands, its task-list ticks, whom it mentions) is what a reader
# sees rendered, so it is read with a CommonMark parser (markdown-it-py), never line by line:
# nothing inside an HTML comment or block, a code fence of any length (an unclosed one runs to
# the end), indented code, a block quote (lazy continuation lines included), an inline code
# span or an inline HTML comment counts.
#
# Comments are read before anyone's rights are checked (an outsider may comment on a public
# repository), so reading must cost little whatever the text: every regular expression that
# meets a comment is linear (no quantifier that backtracks over what another one took:
# tests/test_parsers_linear.py), the parser is linear, each text is parsed once however many
# readers ask (`_reading`), and a text longer than `MAX_TEXT` is refused before any of it.

# GitHub's own limit for a comment or an issue body. A forge without it (Gitea, Forgejo) takes
# megabytes, and even linear reading of markdown costs up to ~20 µs a character (a run of `![`).
MAX_TEXT = 65_536


class TextTooLong(InvalidArguments):
    code = "too_long"


def check_length(text: str, what: str = "this comment", limit: int = MAX_TEXT) -> None:
    """Refuse a text too long to read, before any parser or regular expression sees it."""
    if len(text) > limit:
        raise TextTooLong(f"{what} is {len(text):,} characters; the app reads at most "
                          f"{limit:,}: shorten it or split it into a few comments")


_MD = MarkdownIt("commonmark").disable("text_join")  # keep escapes and entities apart
_LINE_MARK = 0xF0000  # Supplementary Private Use Area-A: one code point per line of a paragraph
_MAX_MARKED = 0xFFFD
_PLANE_15 = re.compile("[\U000f0000-\U000fffff]")


def _lines(text: str) -> list[str]:
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def _parse(text: str) -> list[Token]:
    return _MD.parse(text.replace("\r\n", "\n").replace("\r", "\n"))


def _live_in_paragraph(inline: Token, first: int, last: int) -> set[int]:
    """Which of the source lines first..last-1 of a paragraph begin as text the reader sees at
    the start of a line (not inside an inline HTML comment, code span, link or image)."""
    # the comment's own Plane 15 private-use characters could pass for marks: out with them
    content = _PLANE_15.sub("\ufffd", inline.content).split("\n")
    if len(content) != last - first or len(content) > _MAX_MARKED:
        return set()  # not the plain shape expected: take nothing from it
    marked = "\n".join(chr(_LINE_MARK + k) + line for k, line in enumerate(content))
    [parsed] = _MD.parseInline(marked)
    live: set[int] = set()
    in_link = 0
    for child in parsed.children or []:
        if child.type == "link_open":
            in_link += 1
        elif child.type == "link_close":
            in_link -= 1
        elif child.type == "text" and not in_link:
            for ch in child.content:
                k = ord(ch) - _LINE_MARK
                if 0 <= k < len(content):
                    live.add(first + k)
    return live


@dataclass(frozen=True)
class _Reading:
    paragraph_lines: frozenset[int]
    list_item_lines: frozenset[int]
    visible_text: str


# The same comment is read by several handlers (commands, addressing, mentions, an /ask's
# options): parsed once, its few small results kept for the next reader.
@lru_cache(maxsize=16)
def _reading(text: str) -> _Reading:
    check_length(text)
    tokens = _parse(text)
    return _Reading(_paragraph_lines(tokens), _list_item_lines(tokens), _visible_text(tokens))


def paragraph_lines(text: str) -> frozenset[int]:
    """Source line numbers (0-based, after CRLF → LF) that start a line of a top-level
    paragraph as it renders: where a command may stand. TextTooLong past `MAX_TEXT`."""
    return _reading(text).paragraph_lines


def list_item_lines(text: str) -> frozenset[int]:
    """Source line numbers that begin an item of a top-level bullet list (task boxes live
    there), outside quotes, code and HTML. TextTooLong past `MAX_TEXT`."""
    return _reading(text).list_item_lines


def visible_text(text: str) -> str:
    """The words of a comment as a reader sees them, outside quotes, code, HTML comments and
    images: one paragraph or heading per block, separated by blank lines. An escaped character
    (``\\@``) is kept apart as U+FFFC so it never starts a mention; an entity is decoded.
    TextTooLong past `MAX_TEXT`."""
    return _reading(text).visible_text


def _paragraph_lines(tokens: list[Token]) -> frozenset[int]:
    live: set[int] = set()
    for i, tok in enumerate(tokens):
        if tok.type == "paragraph_open" and tok.level == 0 and tok.map is not None:
            live |= _live_in_paragraph(tokens[i + 1], tok.map[0], tok.map[1])
    return frozenset(live)


def _list_item_lines(tokens: list[Token]) -> frozenset[int]:
    return frozenset(tok.map[0] for tok in tokens
                     if tok.type == "list_item_open" and tok.level == 1
                     and tok.markup in ("-", "*", "+") and tok.map is not None)


def _visible_text(tokens: list[Token]) -> str:
    blocks: list[str] = []
    quoted = 0
    for tok in tokens:
        if tok.type == "blockquote_open":
            quoted += 1
        elif tok.type == "blockquote_close":
            quoted -= 1
        elif tok.type == "inline" and not quoted:
            parts: list[str] = []
            for child in tok.children or []:
                if child.type == "text":
                    parts.append(child.content)
                elif child.type == "text_special":
                    parts.append("\ufffc" if child.info == "escape" else child.content)
                elif child.type in ("softbreak", "hardbreak"):
                    parts.append("\n")
                elif child.type in ("code_inline", "html_inline", "image"):
                    parts.append(" ")
            blocks.append("".join(parts))
    return "\n\n".join(blocks)
