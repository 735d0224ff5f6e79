"""A small browser for the forge's web routes: a cookie jar that keeps the forge's cookies
(aiohttp refuses cookies from IP addresses unless told otherwise), no automatic redirects (tests
look at each hop), and HTML read with the standard library's parser."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any
from urllib.parse import parse_qs, urljoin, urlsplit

import aiohttp
from multidict import CIMultiDict

from localforge import LocalForge


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    text: str = ""


@dataclass
class Form:
    action: str
    method: str
    fields: dict[str, str]
    buttons: list[dict[str, str]]


class Page(HTMLParser):
    """Elements (with their direct text), forms and their fields, ids, in document order."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.html = html
        self.elements: list[Element] = []
        self.forms: list[Form] = []
        self._open: list[Element] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        el = Element(tag, {k: v or "" for k, v in attrs})
        self.elements.append(el)
        if tag == "form":
            self.forms.append(Form(el.attrs.get("action", ""),
                                   el.attrs.get("method", "get").lower(), {}, []))
        elif tag == "input" and self.forms:
            kind = el.attrs.get("type", "text")
            if kind == "submit":
                self.forms[-1].buttons.append(el.attrs)
            elif "name" in el.attrs:
                self.forms[-1].fields[el.attrs["name"]] = el.attrs.get("value", "")
        elif tag == "button" and self.forms:
            self.forms[-1].buttons.append(el.attrs)
        if tag not in ("input", "meta", "link", "br", "img", "hr"):
            self._open.append(el)

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self._open) - 1, -1, -1):
            if self._open[i].tag == tag:
                del self._open[i:]
                break

    def handle_data(self, data: str) -> None:
        for el in self._open:
            el.text += data

    def find(self, tag: str | None = None, **attrs: str) -> list[Element]:
        return [e for e in self.elements if (tag is None or e.tag == tag)
                and all(e.attrs.get(k.rstrip("_").replace("_", "-")) == v
                        for k, v in attrs.items())]

    def ids(self) -> set[str]:
        return {e.attrs["id"] for e in self.elements if "id" in e.attrs}

    @property
    def text(self) -> str:
        body = self.find("body")
        return " ".join(body[0].text.split()) if body else ""


@dataclass
class Reply:
    status: int
    headers: CIMultiDict[str]
    body: str
    url: str

    @property
    def location(self) -> str:
        return self.headers.get("Location", "")

    @property
    def page(self) -> Page:
        return Page(self.body)

    def query(self) -> dict[str, str]:
        """The query of the Location this reply redirects to, one value per name."""
        return {k: v[0] for k, v in parse_qs(urlsplit(self.location).query).items()}


@dataclass
class Browser:
    forge: LocalForge
    session: aiohttp.ClientSession
    history: list[Reply] = field(default_factory=list)

    @classmethod
    def open(cls, forge: LocalForge) -> Browser:
        return cls(forge, aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)))

    async def close(self) -> None:
        await self.session.close()

    async def request(self, method: str, url: str, data: Any = None,
                      headers: dict[str, str] | None = None) -> Reply:
        full = url if url.startswith("http") else self.forge.url + url
        async with self.session.request(method, full, data=data, headers=headers,
                                        allow_redirects=False) as resp:
            reply = Reply(resp.status, CIMultiDict(resp.headers), await resp.text(), full)
        self.history.append(reply)
        return reply

    async def get(self, url: str, headers: dict[str, str] | None = None) -> Reply:
        return await self.request("GET", url, headers=headers)

    async def submit(self, reply: Reply, values: dict[str, str] | None = None,
                     button: str | None = None, index: int = 0) -> Reply:
        """Submit the `index`th form of a page, with `values` over its fields; `button` names
        the submit button pressed (its name=value is sent, as a browser does)."""
        form = reply.page.forms[index]
        data = dict(form.fields)
        data.update(values or {})
        if button is not None:
            pressed = next(b for b in form.buttons if b.get("value") == button
                           or b.get("name") == button)
            if "name" in pressed:
                data[pressed["name"]] = pressed.get("value", "")
        action = urljoin(reply.url, form.action or reply.url)
        return await self.request(form.method.upper(), action, data=data)

    async def follow(self, reply: Reply, limit: int = 10) -> Reply:
        """Follow redirects that stay on the forge; stop at the first that leaves it."""
        while reply.status in (301, 302, 303, 307) and limit > 0:
            target = urljoin(reply.url, reply.location)
            if not target.startswith(self.forge.url):
                return reply
            reply = await self.get(target)
            limit -= 1
        return reply

    async def sign_in(self, login: str, password: str | None = None,
                      return_to: str | None = None) -> Reply:
        path = "/login" + (f"?return_to={return_to}" if return_to else "")
        form = await self.get(path)
        assert form.status == 200, form.body
        return await self.submit(form, {"login": login,
                                        "password": password or self.forge.user_password(login)})

    def cookie(self, name: str) -> str | None:
        for c in self.session.cookie_jar:
            if c.key == name:
                return c.value
        return None


def accessible(page: Page) -> None:
    """What axe-core's serious rules look for that markup alone can show: a language, a
    title, one main landmark with a banner, one h1 and no skipped heading level, every form
    field labelled, every image with alternative text, every link with a name."""
    html = page.find("html")[0]
    assert html.attrs.get("lang") == "en"
    assert page.find("title") and page.find("title")[0].text.strip()
    assert len(page.find("main")) == 1 and page.find("header")
    assert page.find("meta", name="viewport")
    assert len(page.find("h1")) == 1
    levels = [int(e.tag[1]) for e in page.elements if e.tag in ("h1", "h2", "h3", "h4")]
    assert levels[0] == 1 and all(b - a <= 1 for a, b in zip(levels, levels[1:], strict=False))
    for nav in page.find("nav"):
        assert nav.attrs.get("aria-label"), "every nav is named"
    for control in page.find("input") + page.find("select") + page.find("textarea"):
        if control.attrs.get("type") in ("hidden", "submit"):
            continue
        assert page.find("label", for_=control.attrs.get("id", "-")), control.attrs
    for img in page.find("img"):
        assert "alt" in img.attrs
    for a in page.find("a"):
        assert a.text.strip() or a.attrs.get("aria-label"), a.attrs
    for button in page.find("button"):
        assert button.text.strip() or button.attrs.get("aria-label"), button.attrs
    ids = [e.attrs["id"] for e in page.elements if "id" in e.attrs]
    assert len(ids) == len(set(ids)), "ids are unique"
