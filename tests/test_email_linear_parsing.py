"""What a stranger's email is read with runs in linear time on the one event loop: the HTML
part's text, the From name, the meta line of a mail or comment, and an attachment's link
(bot.email.message, bot.email.attachments). Each was a regex that searched the rest of the
text again from each of many starts (100 KB of `<` in an HTML part: 6 s; a From folded over
100 KB of spaces: 14 s). The rewrites give the regexes' answers: checked here against the old
regexes on ordinary text, on seeded random text over the characters that matter to them, and
on the shapes that made them slow (no timings: the answers)."""

from __future__ import annotations

import html
import random
import re

import pytest

from bot.email.attachments import link_of
from bot.email.auth import Verdicts
from bot.email.message import (
    META_PREFIX,
    Attached,
    Inbound,
    display_name,
    html_text,
    meta_json,
    parse_inbound,
    read_meta,
    render_inbound,
)

# -- the regexes as they were ------------------------------------------------------------------

_OLD_TAG = re.compile(r"<[^>]*>")
_OLD_DROP = re.compile(r"(?is)<(script|style|head)\b.*?</\1\s*>")
_OLD_META = re.compile(r"<!-- vaultmail:email (\{.*?\}) -->")


def old_html_text(text: str) -> str:
    text = _OLD_DROP.sub("", text)
    text = re.sub(r"(?i)<br\s*/?>|</p\s*>|</div\s*>|</li\s*>", "\n", text)
    return html.unescape(_OLD_TAG.sub("", text))


def old_display_name(value: str) -> str:
    return re.sub(r"\s*<[^>]*>\s*$", "", value).strip().strip('"')


def old_meta_json(body: str) -> str | None:
    m = _OLD_META.search(body)
    return m.group(1) if m else None


def old_link_of(name: str, text: str) -> str | None:
    m = re.search(r"\[`" + re.escape(name) + r"`\]\(([^)\s]+)\)", text)
    return m.group(1) if m else None


def _random_texts(pieces: list[str], seed: int, count: int = 3000,
                  most: int = 14) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(0, most)))
            for _ in range(count)]


# -- the HTML part's text ----------------------------------------------------------------------

HTML = [
    "",
    "plain text, no tags",
    "<p>Hello <b>Ana</b>,</p><p>see you at 3&nbsp;pm &amp; bring <i>the</i> keys.</p>",
    "<html><head><title>t</title><style>p { color: red }</style></head>"
    "<body><div>one</div><div>two<br>three<br/>four<BR />five</div></body></html>",
    "<script type='text/javascript'>if (a < b && c > d) {}</script>after",
    "<SCRIPT>x</script>, <Style>y</STYLE >, <head>z</head\n>",
    "<script>never closed <b>bold</b>",
    "<style>a</style><style>b",
    "<scripts>not a script element</scripts>",
    "<header>a header element stays</header>",
    "a < b and c > d",
    "3 < 4",
    "<<<>>>",
    "<ul><li>one</li><li>two</li></ul>",
    "&lt;script&gt;escaped&lt;/script&gt;",
    "<ſcript>long s</script>x<ſcript>long s</ſcript>y",
    "<scrİpt>dotted</script>x<scrıpt>dotless</script>y<scrıpt>z</scrıpt>w",
    "<SCRİPT>a</ScRiPt>b",
    "<script>a</scrİpt>b<script>c</scrıpt>d",
    "<head>\n<meta charset=utf-8>\n</head >\n<body>text</body>",
]
HTML_PIECES = ["<", ">", "a", " ", "\n", "<script", "<SCRIPT ", "</script>", "</Script >",
               "<style>", "</style\n>", "<head>", "</HEAD>", "<br>", "<br/>", "</p>", "&amp;",
               "<ſcript>", "</ſcript>", "<scrİpt>", "</scrİpt>", "<scrıpt>", "</scrıpt>",
               "<b>", "</b>", "x"]


@pytest.mark.parametrize("text", HTML)
def test_html_text_reads_ordinary_html_as_before(text: str) -> None:
    assert html_text(text) == old_html_text(text)


def test_html_text_agrees_with_the_old_regexes_on_random_html() -> None:
    for text in _random_texts(HTML_PIECES, seed=1):
        assert html_text(text) == old_html_text(text), text


@pytest.mark.parametrize("text", [
    "<" * 2000,  # a `<` never closed, many times: each searched the rest again
    "<" * 2000 + ">",
    "<script" * 300,
    "<style " * 300 + "</style>",
    "<script>" * 300 + "</style>",
    "<head>" * 100 + "<ſcript>" * 100 + "</head>",
])
def test_html_text_gives_the_old_answers_on_the_slow_shapes(text: str) -> None:
    assert html_text(text) == old_html_text(text)


def test_an_html_part_of_unclosed_tags_is_read_whole() -> None:
    """1 MB of `<` (the old regex: about 10 minutes on the event loop) is text, kept."""
    assert html_text("<" * 1_000_000) == "<" * 1_000_000
    assert html_text("<script" * 100_000) == "<script" * 100_000


# -- the From name -----------------------------------------------------------------------------

FROM = [
    "a@b.co",
    "<a@b.co>",
    "Ana <a@b.co>",
    '"Ana Lima" <ana@example.org>',
    '"Lima, Ana"   <ana@example.org>  ',
    "Ana<a@b.co>",
    "Ana <a@b.co> (work)",
    "Ana <a@b.co> <c@d.co>",
    "Ana <a<b@c.co>",
    "Ana <> ",
    "a@b.co (Ana)",
    "<<a@b.co>>",
    "Ana <a@b.co\n",
    "Ana\u00a0<a@b.co>\u00a0",
    "Ana\x1c<a@b.co>",
    "=?utf-8?q?Ana?= <a@b.co>",
]


@pytest.mark.parametrize("value", FROM)
def test_the_from_name_is_read_as_before(value: str) -> None:
    assert display_name(value) == old_display_name(value)


def test_the_from_name_agrees_with_the_old_regex_on_random_values() -> None:
    pieces = ['"', "<", ">", " ", "\t", "\n", "\u00a0", "\x1c", "a", "@", "b.co", "<a@b.co>"]
    for value in _random_texts(pieces, seed=2):
        assert display_name(value) == old_display_name(value), repr(value)


@pytest.mark.parametrize("value", [
    "x" + " " * 3000 + "y <a@b.co>",
    "<" * 2000 + "> x <a@b.co>",
    " " * 3000,
    "<" * 3000,
])
def test_the_from_name_gives_the_old_answers_on_the_slow_shapes(value: str) -> None:
    assert display_name(value) == old_display_name(value)


def test_a_from_folded_over_many_spaces_is_read() -> None:
    """A From folded over 60 KB of spaces, just within MAX_ADDRESS_HEADER (lines within
    SMTP's 1,000; the old regex: about six seconds on the event loop) gives its name and
    address."""
    fold = b"\r\n ".join([b" " * 980] * 62)
    msg = parse_inbound(b"From: Ana" + fold + b"Lima <a@b.co>\r\nTo: x@y.co\r\n"
                        b"Subject: s\r\n\r\nhi\r\n")
    assert msg.sender == "a@b.co"
    assert msg.sender_name.startswith("Ana ") and msg.sender_name.endswith(" Lima")


# -- the meta line -----------------------------------------------------------------------------

def _rendered() -> str:
    message = Inbound(sender="a@b.co", sender_name="Ana", to=("x@y.co",), cc=(), subject="s",
                      message_id="<m1@b.co>", in_reply_to=(), references=("<m0@b.co>",),
                      automatic=None, text="} --> <!-- vaultmail:email {\nhi")
    attached = (Attached(name="a b.pdf", path="attachments/m/a b.pdf", size=3,
                         content_type="application/pdf", sha="0" * 40),)
    verdicts = Verdicts("pass", "b.co", "none", (), "none", "", "b.co")
    return render_inbound(message, verdicts, attached=attached)


def test_a_rendered_mail_s_meta_is_read_as_before() -> None:
    body = _rendered()
    assert meta_json(body) == old_meta_json(body)
    meta = read_meta(body)
    assert meta is not None and meta.message_id == "<m1@b.co>"
    assert [a.name for a in meta.attachments] == ["a b.pdf"]


META = [
    "",
    "no meta here",
    META_PREFIX + "{} -->",
    META_PREFIX + '{"a":1} -->',
    META_PREFIX + '{"a":1}\n} -->',
    META_PREFIX + '{"a":1}\n' + META_PREFIX + '{"b":2} -->',
    "text\n" + META_PREFIX + "{ -->} -->\nmore",
    META_PREFIX + "{" + META_PREFIX + "{x} -->",
    META_PREFIX + "{}} -->",
    META_PREFIX + "{} --> " + META_PREFIX + "{y} -->",
    META_PREFIX + " {x} -->",
]


@pytest.mark.parametrize("body", META)
def test_the_meta_line_is_found_as_before(body: str) -> None:
    assert meta_json(body) == old_meta_json(body)


def test_the_meta_line_agrees_with_the_old_regex_on_random_bodies() -> None:
    pieces = [META_PREFIX + "{", META_PREFIX, "{", "}", " -->", "} -->", "}", "\n", "x", " ",
              "<!-- ", "-->"]
    for body in _random_texts(pieces, seed=3):
        assert meta_json(body) == old_meta_json(body), repr(body)


@pytest.mark.parametrize("body", [
    (META_PREFIX + "{") * 1000,
    (META_PREFIX + "{") * 1000 + "} -->",
    (META_PREFIX + "{") * 1000 + "\n} -->",
    ((META_PREFIX + "{") * 100 + "\n") * 10 + "x} -->",
])
def test_the_meta_line_gives_the_old_answers_on_the_slow_shapes(body: str) -> None:
    assert meta_json(body) == old_meta_json(body)


# -- an attachment's link ----------------------------------------------------------------------

LINKS = [
    ("a.pdf", "| [`a.pdf`](https://forge.example/a/b/blob/main/a.pdf) | 3 bytes |"),
    ("a.pdf", "[`a.pdf`](attachments/m/a.pdf)"),
    ("a.pdf", "[`a.pdf`]() [`a.pdf`](x)"),
    ("a.pdf", "[`a.pdf`](has space) [`a.pdf`](second)"),
    ("a.pdf", "[`a.pdf`](never closed"),
    ("a b.pdf", "[`a b.pdf`](xx[`a b.pdf`](target)"),
    ("a b.pdf", "[`a b.pdf`](t)"),
    ("x.txt", "[`a.pdf`](t)"),
    ("a+b.txt", "[`a+b.txt`](u)"),
]


@pytest.mark.parametrize(("name", "text"), LINKS)
def test_an_attachment_s_link_is_found_as_before(name: str, text: str) -> None:
    assert link_of(name, text) == old_link_of(name, text)


def test_an_attachment_s_link_agrees_with_the_old_regex_on_random_text() -> None:
    for name in ("a", "a b", "a.b"):
        pieces = [f"[`{name}`](", ")", " ", "\n", "x", "(", "[`", "`](", name, f"[`{name}`]"]
        for text in _random_texts(pieces, seed=4):
            assert link_of(name, text) == old_link_of(name, text), (name, text)


@pytest.mark.parametrize("text", [
    "[`a`](" * 1500,
    "[`a`](" * 1500 + ")",
    "[`a`](" * 1500 + " [`a`](t)",
])
def test_an_attachment_s_link_gives_the_old_answers_on_the_slow_shapes(text: str) -> None:
    assert link_of("a", text) == old_link_of("a", text)
