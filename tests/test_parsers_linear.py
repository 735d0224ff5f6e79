"""Reading what anyone writes costs time linear in its length (issue 21): a 30,000-character
`/ask` by an outsider on a public repository once held the whole app for 19 s, in regular
expressions that backtracked, before any of its rights were checked.

Nothing here is timed. Each adversarial input is sized so that a regular expression that
backtracks would run for minutes (n² steps of a few nanoseconds, n = 200,000) where a linear one
takes milliseconds; `within` interrupts the block long before that (the regular expression
engine checks for signals as it runs), so a super-linear pattern fails the test instead of
hanging it. Texts past the caps are refused with a message that says so, before any of them is
read.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import pytest

from bot.app.embedded import Embedded
from bot.items import model, questions, render, service
from bot.items.questions import Question
from bot.mail import commands, header, mailer, markdown
from bot.mail.commands import parse_commands
from bot.mail.markdown import MAX_TEXT, TextTooLong
from tests.items_support import forge_comments, make_item, where
from tests.support import Actor

N = 200_000
BOUND = 20.0  # seconds: far above linear work (ms), far below quadratic work (minutes)


class TookTooLong(Exception):
    pass


@contextmanager
def within(seconds: float) -> Iterator[None]:
    """Interrupt the block after `seconds` (in the main thread, where pytest runs sync tests)."""
    def late(signum: int, frame: FrameType | None) -> None:
        raise TookTooLong(f"still running after {seconds} s: super-linear")

    before = signal.signal(signal.SIGALRM, late)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


def _all(pattern: re.Pattern[str], text: str) -> None:
    """Every way the app uses a pattern: match, search, each match, split."""
    pattern.match(text)
    pattern.search(text)
    for _ in pattern.finditer(text):
        pass
    pattern.split(text, maxsplit=1)


SPACES = " " * N
# (name, pattern, inputs that make a backtracking pattern rescan a run from each character)
CASES: list[tuple[str, re.Pattern[str], list[str]]] = [
    # the three that were quadratic (a run of whitespace inside an /ask option line)
    ("render._TASK", render._TASK, ["- [ ] a" + SPACES + "b", "- [ ]" + SPACES,
                                     SPACES + "x", "-" + SPACES + "x"]),
    ("render._RECOMMENDED", render._RECOMMENDED, ["a" + SPACES + "b", "(" * N]),
    ("render._DASH", render._DASH, ["a" + SPACES + "b", "a" + " -" * (N // 2)]),
    # the rest that meet comments, issue titles and bodies anyone may write
    ("render._ADDRESS_LINE", render._ADDRESS_LINE, [SPACES + "to" + SPACES + "x",
                                                     "to:" + SPACES, "cc" + SPACES]),
    ("render._MENTION", render._MENTION, ["@a" + "-" * N + "!", "@" + "a-" * (N // 2),
                                           "@a/" + "." * N + "!", "@" * N]),
    ("render address split", re.compile(r"[,\s]+"), [" ," * (N // 2) + "x"]),
    ("commands._COMMAND", commands._COMMAND, ["/ask" + SPACES + "x", "   /" + "a" * N + "!",
                                               "/" + "a" * N + "-"]),
    ("markdown._ENTITY_AT", markdown._ENTITY_AT, ["&#" + "0" * N, "&#x" + "0" * N,
                                                   "&#0" * (N // 3)]),
    ("markdown._LIVE_AT", markdown._LIVE_AT, ["@" * N, "a@" * (N // 2)]),
    ("questions._OTHER", questions._OTHER, [SPACES + "other", SPACES + "x"]),
    ("model._PART_OF", model._PART_OF, ["part of" + SPACES + "x", "part of " + "a" * N,
                                         "part of a/" + "a" * N, "part of " * (N // 8)]),
    ("model._TITLE_KEY", model._TITLE_KEY, [SPACES + "A-1", "[" + SPACES]),
    ("model._BODY_KEY", model._BODY_KEY, ["key:" + SPACES + "x", "key: A-1" + SPACES + "x",
                                           " \n" * (N // 2)]),
    ("model._FIRST_LINE_KEY", model._FIRST_LINE_KEY, [SPACES + "A-1" + SPACES + "x"]),
    ("header._SEPARATOR_RE", header._SEPARATOR_RE, ["---" + SPACES + "x", "---\n" * (N // 4)]),
    ("header._ANY_HEADER_RE", header._ANY_HEADER_RE, ["<!--" + SPACES + "x", "<!--" * N]),
    ("mailer._RE", mailer._RE, ["re:" * N + "x", "re: " * (N // 4) + "x"]),
]


@pytest.mark.parametrize(("name", "pattern", "texts"), CASES, ids=[c[0] for c in CASES])
def test_every_pattern_that_reads_what_anyone_writes_is_linear(
        name: str, pattern: re.Pattern[str], texts: list[str]) -> None:
    with within(BOUND):
        for text in texts:
            _all(pattern, text)


def test_an_issue_body_with_a_header_like_comment_is_taken_apart_in_one_pass() -> None:
    """`split_mail_body` runs on issues anyone opens (its header check has a pattern of its
    own, and its cap comes after it)."""
    with within(BOUND):
        for body in ("<!-- vaultmail:header v1 {" + "}" * N + " -->\n" + "---" + SPACES,
                     "<!--" + SPACES + "vaultmail:header v1 {" + " " * N + "-->",
                     "<!-- vaultmail:header v1 {" + "} -- " * (N // 5) + "-->"):
            assert header.split_mail_body(body).header is None


def test_the_30000_character_ask_line_is_read_at_once_and_as_before() -> None:
    """The line of the report: a box, its label, 30,000 spaces, then the rest. Its option reads
    as it always did, in a linear pass (19 s before); a comment that long is refused unread."""
    line = "- [ ] **Keep** (recommended)" + " " * 15_000 + "—" + " " * 15_000 + "nobody waits"
    with pytest.raises(TextTooLong, match=r"30,0\d\d characters; the app reads at most 16,000"):
        render.parse_ask("Which?", line)
    with within(BOUND):
        task = render._TASK.match(line)
        assert task is not None
        assert render.option_of(task["text"]) == {
            "label": "Keep", "description": "nobody waits", "recommended": True}
        assert render.option_of("a" + SPACES + "(recommend)" + SPACES + "-" + SPACES + "b") == {
            "label": "a", "description": "b", "recommended": True}
    assert render.parse_ask("Which?", "- [ ] Keep  (Recommended)  -  nobody  waits  ").options \
        == [{"label": "Keep", "description": "nobody  waits", "recommended": True}]
    assert render.parse_ask("Which?", "- [ ] A - B — C (recommended) (recommended) D").options \
        == [{"label": "A", "description": "B — C  D", "recommended": True}]


def test_the_readers_are_linear_up_to_their_caps() -> None:
    """Whole comments as long as each reader takes, each built against the readers."""
    worst = {
        "an option line of spaces": "/ask Which?\n- [ ] a" + " " * 15_000 + "b",
        "brackets": "[" * 15_000, "images": "![" * 7_500, "emphasis": "*_" * 7_500,
        "mentions": "@a-" * 5_000, "entities": "&#0" * 5_000, "lines": "a\n" * 7_500,
    }
    with within(BOUND):
        for text in worst.values():
            render.parse_addressing(text)
            render.parse_ask("", text)
            render.mentions(text)
            render.ticked_option(text, Question(body="q"), text)
        for text in ("/close\n" + "![" * 8_000, "/close " + " " * (MAX_TEXT - 8)):
            assert [c.name for c in parse_commands(text)] == ["close"]


def test_past_the_caps_nothing_is_read_and_the_refusal_says_why() -> None:
    huge = "/ask Which?\n" + "- [ ] a" + " " * 1_000_000 + "b\n/close"
    assert render.MAX_COMMENT > service.MAX_BODY + 4 * (
        questions.MAX_LABEL + questions.MAX_DESCRIPTION), "room for an /ask's options"
    with within(BOUND):
        assert parse_commands(huge) == [], "a comment longer than GitHub takes holds no command"
        for read in (render.parse_addressing, render.mentions, markdown.visible_text,
                     markdown.paragraph_lines, markdown.list_item_lines,
                     lambda text: render.parse_ask("", text)):
            with pytest.raises(TextTooLong) as refused:
                read(huge)
            assert refused.value.code == "too_long"
            assert "1,000,0" in refused.value.message and "at most" in refused.value.message
        assert render.ticked_option("- [ ] 1. **A**", Question(body="q"), huge) is None


# -- through the app ---------------------------------------------------------------------------


async def test_an_outsiders_30000_character_ask_is_refused_before_it_is_read(
        embedded: Embedded, session: Any) -> None:
    """The report's comment, by someone outside the office on a public repository's item:
    one refusal that names the cap (said once; the next is only ledgered)."""
    forge = embedded.forge
    forge.add_repo("acme", "website", private=False)
    forge.set_permission("acme/website", "marco", "write")  # to label the item
    embedded.forge_tokens["troll"] = forge.add_user("troll")
    troll, marco = Actor(session, embedded, "troll"), Actor(session, embedded, "marco")
    ref = await make_item(embedded, marco, "goal", "Launch", repo="acme/website")
    repo, number = where(ref)
    ask = "/ask Which?\n- [ ] a" + " " * 30_000 + "b"
    await troll.comment(repo, number, ask)
    await embedded.settle()
    replies = [c["body"] for c in await forge_comments(marco, ref)
               if c["body"].startswith("@troll ")]
    assert len(replies) == 1 and f"this comment is {len(ask):,} characters; the app reads " \
        "at most 16,000" in replies[0], replies

    again = "/ask Again?\n- [ ] a" + " " * 60_000 + "b"  # as long as GitHub takes
    await troll.comment(repo, number, again)
    await embedded.settle()
    denied = [e.data.get("reason", "") for e in await embedded.ledger_events("run.denied")
              if e.actor == "forge:troll"]
    assert any(f"this comment is {len(again):,} characters" in r for r in denied), denied


async def test_an_ask_with_a_pathological_option_line_still_makes_its_card(
        embedded: Embedded, person: Callable[[str], Actor]) -> None:
    marco = person("marco")
    ref = await make_item(embedded, marco, "goal", "Launch")
    repo, number = where(ref)
    await marco.comment(repo, number, "/ask Which one? @sara\n- [ ] Keep" + " " * 12_000
                        + "— nobody is signed out (recommended)\n- [ ] Drop — ships clean")
    await embedded.settle()
    [card] = [c["body"] for c in await forge_comments(marco, ref) if "kind=question" in c["body"]]
    assert "- [ ] 1. **Keep** (recommended) — nobody is signed out" in card
    assert "- [ ] 2. **Drop** — ships clean" in card
