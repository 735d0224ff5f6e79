"""Markdown as the forge's pages show it: CommonMark with tables and strikethrough, raw HTML
reduced to a short allow-list of tags without attributes (`<details>`, `<summary>`, `<b>`,
...), HTML comments hidden (as GitHub hides them: vaultmail's signed header is one), anything
else shown as text. Headings in a body sit below the page's own (its top level is `<h4>`)."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from html.parser import HTMLParser
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.token import Token

ALLOWED = frozenset({
    "details", "summary", "b", "i", "em", "strong", "code", "kbd", "sub", "sup", "p", "ul",
    "ol", "li", "blockquote", "pre", "del", "s", "ins", "mark", "small", "dl", "dt", "dd",
})
VOID = frozenset({"br", "hr"})
HEADING_BASE = 3  # a body's headings start below the h3 of its comment


class _Clean(HTMLParser):
    """Re-emit a chunk of raw HTML: allowed tags bare, everything else escaped as text."""

    def __init__(self, stack: list[str]) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.stack = stack

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in VOID:
            self.out.append(f"<{tag}>")
        elif tag in ALLOWED:
            self.out.append(f"<{tag}>")
            self.stack.append(tag)
        else:
            self.out.append(escape(self.get_starttag_text() or f"<{tag}>"))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in VOID:
            self.out.append(f"<{tag}>")
        else:
            self.out.append(escape(self.get_starttag_text() or f"<{tag}/>"))

    def handle_endtag(self, tag: str) -> None:
        if tag in ALLOWED and tag in self.stack:
            while self.stack:
                top = self.stack.pop()
                self.out.append(f"</{top}>")
                if top == tag:
                    break
        else:
            self.out.append(escape(f"</{tag}>"))

    def handle_data(self, data: str) -> None:
        self.out.append(escape(data, quote=False))

    def handle_comment(self, data: str) -> None:
        """Hidden, as on GitHub."""

    def handle_decl(self, decl: str) -> None:
        self.out.append(escape(f"<!{decl}>"))

    def unknown_decl(self, data: str) -> None:
        self.out.append(escape(f"<![{data}]>"))

    def handle_pi(self, data: str) -> None:
        self.out.append(escape(f"<?{data}>"))


def _clean(html: str, env: dict[str, Any]) -> str:
    stack: list[str] = env.setdefault("open_tags", [])
    parser = _Clean(stack)
    parser.feed(html)
    parser.close()
    return "".join(parser.out)


def _html(renderer: Any, tokens: Sequence[Token], idx: int, options: Any,
          env: dict[str, Any]) -> str:
    return _clean(tokens[idx].content, env)


def _heading(renderer: Any, tokens: Sequence[Token], idx: int, options: Any,
             env: dict[str, Any]) -> str:
    token = tokens[idx]
    level = env["heading_levels"][token.tag]
    return f"<h{level}>" if token.nesting == 1 else f"</h{level}>\n"


def _build() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": True, "linkify": False, "typographer": False})
    md.enable(["table", "strikethrough"])
    for rule in ("html_block", "html_inline"):
        md.add_render_rule(rule, _html)
    md.add_render_rule("heading_open", _heading)
    md.add_render_rule("heading_close", _heading)
    return md


_MD = _build()


def render(text: str | None, heading_base: int = HEADING_BASE) -> str:
    """HTML for a body: safe to put in a page as it is; its highest heading level becomes
    h(heading_base + 1), the next h(heading_base + 2), and so on."""
    if not text:
        return ""
    env: dict[str, Any] = {}
    tokens = _MD.parse(text, env)
    # by rank, so that a body's `##` under its comment's h3 is an h4, not a skipped level
    used = sorted({t.tag for t in tokens if t.type == "heading_open"})
    env["heading_levels"] = {tag: min(6, heading_base + 1 + i) for i, tag in enumerate(used)}
    out: str = _MD.renderer.render(tokens, _MD.options, env)
    return out + "".join(f"</{tag}>" for tag in reversed(env.get("open_tags", [])))
