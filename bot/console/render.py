"""Server-rendered pages: Jinja2 templates (autoescaped), Markdown without raw HTML."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markdown_it import MarkdownIt
from markupsafe import Markup

HERE = Path(__file__).parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"

# Someone's text is data: rendered as CommonMark with raw HTML off (it shows as text) and
# markdown-it's own link check (no javascript: or data: links).
_MD = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable("table")


def markdown(text: str | None) -> Markup:
    return Markup(_MD.render(text or ""))  # noqa: S704 (markdown-it escapes; html is off)


def when(value: Any) -> str:
    """A time for people: `2026-12-02 12:22 UTC`, from ISO text or epoch seconds."""
    if value is None or value == "":
        return ""
    try:
        if isinstance(value, int | float):
            moment = datetime.fromtimestamp(float(value), UTC)
        else:
            moment = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return str(value)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def iso(value: Any) -> str:
    """The same time for a <time datetime=...> attribute."""
    try:
        if isinstance(value, int | float):
            return datetime.fromtimestamp(float(value), UTC).isoformat().replace("+00:00", "Z")
        return str(value)
    except (ValueError, OverflowError):
        return ""


def short(principal: str | None) -> str:
    """`human:marco@acme.com` reads `marco@acme.com`; `agent:scout` reads `scout`."""
    if not principal:
        return ""
    kind, _, ident = principal.partition(":")
    return ident if kind in ("human", "agent") and ident else principal


_env = Environment(loader=FileSystemLoader(str(TEMPLATES)),
                   autoescape=select_autoescape(["html"], default=True),
                   trim_blocks=True, lstrip_blocks=True)
_env.filters.update(markdown=markdown, when=when, iso=iso, short=short)
# a form's idempotencyKey, made as the page is drawn: sending it twice acts once
_env.globals["new_key"] = lambda: secrets.token_urlsafe(16)


def page(template: str, context: dict[str, Any], *, status: int = 200) -> web.Response:
    body = _env.get_template(template).render(**context)
    return web.Response(text=body, status=status, content_type="text/html", charset="utf-8",
                        headers=SECURITY_HEADERS)


# No script but our own files, no framing, no inline anything: what a page shows is data.
SECURITY_HEADERS = {
    "Content-Security-Policy": ("default-src 'self'; script-src 'self'; style-src 'self'; "
                                "img-src 'self' data:; connect-src 'self'; "
                                "frame-ancestors 'none'; form-action 'self'; "
                                "base-uri 'none'"),
    "X-Frame-Options": "DENY",  # (for a browser that knows no frame-ancestors)
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
