"""Registering vaultmail's GitHub App from its manifest (`app.yml`), as GitHub describes it in
"Registering a GitHub App from a manifest".

1. A page (`GET /setup?key=KEY`, the key printed where it started) holds a form with the
   manifest as JSON in a hidden `manifest` field and a random `state`, posting to the forge's
   "new App from manifest" URL
   (`{forge}/settings/apps/new`, or `{forge}/organizations/{org}/settings/apps/new`).
2. The forge creates the App once the operator confirms, and sends the browser back to the
   manifest's `redirect_url` (`/setup/callback` here) with `code` and the same `state`.
3. The code is exchanged, within an hour and once, at `POST {api}/app-manifests/{code}/conversions`
   for the App's id, private key, webhook secret, client id and secret, which are written to
   `.env` (mode 0600, the file's other lines kept); the page then links to the App's install
   page (`{forge}/apps/{slug}/installations/new`).

`vaultmail register` serves this page on localhost (bot/cli/register.py); `vaultmail serve`
started without credentials serves it on its own port, as Probot does, then carries on as a
normal serve with the new `.env` (`serve_until_registered`). Whoever registers the App owns
what the deployment runs as (its webhooks, its private keys), and `serve` may listen where
anyone reaches it: the page gives out a form only with the key it printed, and a state counts
only when the forge sends back the browser it was given to (a cookie: over https a `__Host-`
one, `bot.app.cookies`, as the console's).
"""

from __future__ import annotations

import asyncio
import html
import json
import re
import secrets
import socket
import sys
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlencode, urlsplit

import aiohttp
import yaml
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from bot.app import cookies
from bot.app.bodies import json_response
from bot.app.settings import NotRegistered, Settings
from bot.digits import whole
from bot.errors import retry_headers
from bot.private_files import write_private

PLACEHOLDER = "https://vaultmail.invalid"  # app.yml's stand-in for the app's public URL
GITHUB = "https://github.com"
BROWSER_COOKIE = "vaultmail_setup"
STATE_TTL = 3600.0  # the forge's code lasts an hour; a state need not outlive it
MAX_STATES = 256
TIMEOUT = aiohttp.ClientTimeout(total=30)


class SetupError(ValueError):
    """Registration cannot go on; the message says what was wrong and what to do."""


# --------------------------------------------------------------------------------------------
# The manifest

# The events an App may subscribe to, each with the permissions any one of which allows it
# ("Webhook events and payloads"); every App holds metadata. These reach every App without it.
ALWAYS_SENT = frozenset({"installation", "installation_repositories", "installation_target",
                         "meta", "github_app_authorization"})
EVENT_PERMISSIONS: dict[str, tuple[str, ...]] = {
    "check_run": ("checks",), "check_suite": ("checks",), "commit_comment": ("contents",),
    "create": ("contents",), "delete": ("contents",), "deployment": ("deployments",),
    "deployment_status": ("deployments",), "discussion": ("discussions",),
    "discussion_comment": ("discussions",), "fork": ("contents",), "gollum": ("contents",),
    "issue_comment": ("issues", "pull_requests"), "issues": ("issues",),
    "label": ("metadata",), "member": ("members",), "membership": ("members",),
    "milestone": ("issues", "pull_requests"), "organization": ("members",),
    "public": ("metadata",), "pull_request": ("pull_requests",),
    "pull_request_review": ("pull_requests",), "pull_request_review_comment": ("pull_requests",),
    "push": ("contents",), "release": ("contents",), "repository": ("metadata",),
    "repository_dispatch": ("contents",), "star": ("metadata",), "status": ("statuses",),
    "issue_dependencies": ("issues",), "sub_issues": ("issues",), "team": ("members",),
    "team_add": ("members",),
    "watch": ("metadata",), "workflow_run": ("actions",),
}


def _http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"should be a full http(s) URL, got {value!r}")
    return value


class HookAttributes(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str
    active: bool = True

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return _http_url(value)


class Manifest(BaseModel):
    """app.yml: the parameters GitHub documents for a manifest, and nothing else."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=34)  # GitHub's limit on an App's name
    url: str  # the App's homepage (required)
    hook_attributes: HookAttributes | None = None
    redirect_url: str | None = None
    callback_urls: list[str] = Field(default_factory=list, max_length=10)
    setup_url: str | None = None
    description: str | None = None
    public: bool = False
    default_events: list[str] = Field(default_factory=list)
    default_permissions: dict[str, Literal["read", "write", "admin"]] = Field(
        default_factory=dict)
    request_oauth_on_install: bool = False
    setup_on_update: bool = False

    @field_validator("url", "redirect_url", "setup_url")
    @classmethod
    def _urls(cls, value: str | None) -> str | None:
        return None if value is None else _http_url(value)

    @field_validator("callback_urls")
    @classmethod
    def _callbacks(cls, value: list[str]) -> list[str]:
        return [_http_url(v) for v in value]

    @field_validator("default_events")
    @classmethod
    def _events(cls, events: list[str]) -> list[str]:
        for event in events:
            if event in ALWAYS_SENT:
                raise ValueError(f"{event!r} reaches every App without subscribing: remove it")
            if event not in EVENT_PERMISSIONS:
                raise ValueError(f"{event!r} is not an event an App can subscribe to")
        return events

    @model_validator(mode="after")
    def _covered(self) -> Manifest:
        held = {*self.default_permissions, "metadata"}
        for event in self.default_events:
            if not held & set(EVENT_PERMISSIONS[event]):
                raise ValueError(f"default_events: {event!r} needs the "
                                 f"{' or '.join(EVENT_PERMISSIONS[event])} permission in "
                                 "default_permissions")
        return self


def load_manifest(path: Path | None = None) -> Manifest:
    """app.yml from `path`, else ./app.yml, else the one shipped with vaultmail; every problem
    names the file and the parameter."""
    if path is None:
        local = Path("app.yml")
        where = str(local) if local.exists() else "app.yml (shipped with vaultmail)"
        text = (local.read_text() if local.exists()
                else resources.files("bot").joinpath("app.yml").read_text())
    else:
        where = str(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise SetupError(f"{path}: cannot read it ({exc.strerror}): give the App's "
                             "manifest (app.yml)") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SetupError(f"{where}: not YAML ({exc})") from None
    if not isinstance(data, dict):
        raise SetupError(f"{where}: should be a mapping of the manifest's parameters")
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        why = ("not a manifest parameter (GitHub documents: "
               f"{', '.join(Manifest.model_fields)})" if err["type"] == "extra_forbidden"
               else str(err["msg"]).removeprefix("Value error, "))
        raise SetupError(f"{where}: {loc + ': ' if loc else ''}{why}") from None


def manifest_for(manifest: Manifest, *, public_url: str, redirect_url: str,
                 name: str | None = None, public: bool | None = None) -> dict[str, Any]:
    """The manifest as the form posts it: the app's public URL in place of the placeholder,
    `redirect_url` back to the page that started the registration."""
    base = public_url.rstrip("/")

    def placed(url: str) -> str:
        return base + url[len(PLACEHOLDER):] if url.startswith(PLACEHOLDER) else url

    data = manifest.model_dump(exclude_none=True)
    if manifest.hook_attributes is not None:
        data["hook_attributes"]["url"] = placed(manifest.hook_attributes.url)
    if manifest.setup_url is not None:
        data["setup_url"] = placed(manifest.setup_url)
    data["callback_urls"] = [placed(u) for u in manifest.callback_urls]
    data["redirect_url"] = redirect_url
    if name is not None:
        data["name"] = name
    if public is not None:
        data["public"] = public
    return data


def public_url_of(value: str, what: str = "--url") -> str:
    """The app's public URL (webhooks go to it + /webhook): http(s), a host, no query."""
    parts = urlsplit(value.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query \
            or parts.fragment:
        raise SetupError(f"{what}={value!r}: should be the app's public URL, http(s)://HOST[:PORT]"
                         " (the forge sends webhooks to it + /webhook), e.g. "
                         "https://vaultmail.example.com")
    return value.strip().rstrip("/")


# --------------------------------------------------------------------------------------------
# The forge


@dataclass(frozen=True)
class Forge:
    """Where the forge's web pages and its REST API are."""

    web: str
    api: str

    @classmethod
    def from_web(cls, url: str) -> Forge:
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.query:
            raise SetupError(f"--forge={url!r}: should be the forge's web address, e.g. "
                             f"{GITHUB} or https://ghe.example.com")
        if parts.netloc.lower() == "api.github.com" or parts.path.rstrip("/").endswith("/api/v3"):
            raise SetupError(f"--forge={url!r} is an API address: give the web address "
                             f"({GITHUB}, or GitHub Enterprise's https://HOST)")
        web_url = f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"
        if parts.netloc.lower() in ("github.com", "www.github.com"):
            return cls(GITHUB, "https://api.github.com")
        return cls(web_url, f"{web_url}/api/v3")  # GitHub Enterprise Server's REST API

    @classmethod
    def from_api(cls, api: str) -> Forge:
        api = api.rstrip("/")
        if api == "https://api.github.com":
            return cls(GITHUB, api)
        return cls(api.removesuffix("/api/v3"), api)

    @property
    def is_github(self) -> bool:
        return self.web == GITHUB

    def new_app_url(self, org: str | None) -> str:
        if org:
            return f"{self.web}/organizations/{org}/settings/apps/new"
        return f"{self.web}/settings/apps/new"

    def install_url(self, slug: str) -> str:
        return f"{self.web}/apps/{slug}/installations/new"

    def env(self) -> dict[str, str]:
        """What tells `vaultmail serve` which forge to talk to (nothing for github.com)."""
        if self.is_github:
            return {}
        if self.api == f"{self.web}/api/v3":
            parts = urlsplit(self.web)
            if not parts.path:
                out = {"GHE_HOST": parts.netloc}
                if parts.scheme == "http":
                    out["GHE_PROTOCOL"] = "http"
                return out
        return {"GITHUB_API_URL": self.api}


# --------------------------------------------------------------------------------------------
# .env

# Every name `serve` reads the App and its forge from: what registration writes replaces all
# of them, so that no older value (GITHUB_APP_ID beside APP_ID, say) wins over the new one.
CREDENTIALS = ("APP_ID", "GITHUB_APP_ID", "PRIVATE_KEY", "GITHUB_PRIVATE_KEY",
               "PRIVATE_KEY_PATH", "GITHUB_PRIVATE_KEY_PATH", "WEBHOOK_SECRET",
               "GITHUB_WEBHOOK_SECRET", "GITHUB_CLIENT_ID", "CLIENT_ID", "GITHUB_CLIENT_SECRET",
               "CLIENT_SECRET", "GHE_HOST", "GHE_PROTOCOL", "GITHUB_API_URL")
# Names that mean an App is already registered there
REGISTERED = ("APP_ID", "GITHUB_APP_ID", "PRIVATE_KEY", "GITHUB_PRIVATE_KEY",
              "PRIVATE_KEY_PATH", "GITHUB_PRIVATE_KEY_PATH", "WEBHOOK_SECRET",
              "GITHUB_WEBHOOK_SECRET")
_ASSIGN = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)$")


def _entries(lines: list[str]) -> list[tuple[str | None, list[str]]]:
    """The file as (name or None, its lines): a quoted value may run over several lines."""
    out: list[tuple[str | None, list[str]]] = []
    i = 0
    while i < len(lines):
        m = _ASSIGN.match(lines[i])
        if m is None:
            out.append((None, [lines[i]]))
            i += 1
            continue
        value, span = m.group(2), [lines[i]]
        quote = value[:1]
        if quote in ("'", '"') and not _closes(value[1:], quote):
            while i + 1 < len(lines):
                i += 1
                span.append(lines[i])
                if _closes(lines[i], quote):
                    break
        out.append((m.group(1), span))
        i += 1
    return out


def _closes(text: str, quote: str) -> bool:
    escaped = False
    for ch in text:
        if escaped:
            escaped = False
        elif ch == "\\" and quote == '"':
            escaped = True
        elif ch == quote:
            return True
    return False


def registered_in(path: Path) -> list[str]:
    """The names in `path` that say an App is already registered there."""
    if not path.exists():
        return []
    found = []
    for name, span in _entries(path.read_text().splitlines(keepends=True)):
        m = _ASSIGN.match(span[0])
        if name in REGISTERED and m is not None and m.group(2).strip() not in ("", '""', "''"):
            found.append(name)
    return found


def _quoted(value: str) -> str:
    if "\n" in value or '"' in value or "'" in value or "\\" in value:
        escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'"{escaped}"'
    if re.search(r"[\s#$`]", value):
        return f"'{value}'"  # literal: no escapes, no ${...} expansion
    return value


@dataclass(frozen=True)
class EnvWritten:
    path: Path
    written: list[str]
    removed: list[str]  # older names of the same settings, taken out
    kept: int  # the file's other lines, kept as they were


def write_env(path: Path, values: Mapping[str, str]) -> EnvWritten:
    """Merge `values` into the .env at `path` (created if need be), mode 0600, atomically.

    Lines naming a credential (`CREDENTIALS`) are replaced by the new values, which go where
    the first of them was, or at the end; every other line stays as it was."""
    lines = path.read_text().splitlines(keepends=True) if path.exists() else []
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    new = [f"{k}={_quoted(v)}\n" for k, v in values.items()]
    out: list[str] = []
    removed: list[str] = []
    kept, placed = 0, False
    for name, span in _entries(lines):
        if name in CREDENTIALS:
            if name not in values:
                removed.append(name)
            if not placed:
                out += new
                placed = True
            continue
        out += span
        kept += 1 if name is not None or span[0].strip() else 0
    if not placed:
        out += new
    write_private(path, "".join(out))
    return EnvWritten(path, list(values), removed, kept)


# --------------------------------------------------------------------------------------------
# The exchange


async def convert(forge: Forge, code: str) -> dict[str, Any]:
    """`POST {api}/app-manifests/{code}/conversions`: the App and its credentials (once)."""
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,128}", code):
        raise SetupError(f"{code[:40]!r} is not a code the forge gives out; start again at "
                         "/setup")
    url = f"{forge.api}/app-manifests/{code}/conversions"  # (its answer: the App's secrets, from
    # the forge alone: a redirect is not followed but reported)
    headers = {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28",
               "User-Agent": "vaultmail-register"}
    try:
        async with aiohttp.ClientSession(timeout=TIMEOUT) as http, \
                http.post(url, headers=headers, allow_redirects=False) as resp:
            status, text = resp.status, await resp.text()
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise SetupError(f"cannot reach the forge's API at {forge.api} ({exc!r}): check "
                         "the forge's address, then start again at /setup") from exc
    if status == 404:
        raise SetupError(f"the forge answered 404 to the code: a code is good for one hour and "
                         f"one exchange ({url}); start again at /setup")
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if status != 201 or not isinstance(body, dict):
        message = body.get("message") if isinstance(body, dict) else text[:200]
        errors = body.get("errors") if isinstance(body, dict) else None
        raise SetupError(f"the forge answered {status} to the code ({message}"
                         f"{': ' + '; '.join(map(str, errors)) if errors else ''}); "
                         "start again at /setup")
    missing = [k for k in ("id", "slug", "pem", "webhook_secret", "client_id", "client_secret")
               if not body.get(k)]
    if missing:
        raise SetupError(f"the forge's answer lacks {', '.join(missing)} (a webhook secret "
                         "needs hook_attributes.active: true in app.yml); start again at /setup")
    return body


@dataclass(frozen=True)
class Registered:
    app_id: int
    slug: str
    name: str
    owner: str
    install_url: str
    env: EnvWritten


def credentials(app: Mapping[str, Any], forge: Forge) -> dict[str, str]:
    """What `vaultmail serve` needs, by Probot's names (it reads them, and GITHUB_*)."""
    pem = str(app["pem"])
    return {"APP_ID": str(app["id"]), "PRIVATE_KEY": pem if pem.endswith("\n") else pem + "\n",
            "WEBHOOK_SECRET": str(app["webhook_secret"]),
            "GITHUB_CLIENT_ID": str(app["client_id"]),
            "GITHUB_CLIENT_SECRET": str(app["client_secret"]), **forge.env()}


# --------------------------------------------------------------------------------------------
# The pages


def _page(title: str, body: str, status: int = 200) -> web.Response:
    text = (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)}"
            "</title><style>body{font-family:system-ui,sans-serif;max-width:42em;margin:2em auto;"
            "line-height:1.5}code{background:#f3f3f3;padding:0 .2em}</style></head><body>"
            f"<h1>{html.escape(title)}</h1>{body}</body></html>")
    # no referrer: the page's address holds the key (or the forge's code and the state), and
    # its form and links go to the forge, another site (a browser's default may send it all)
    return web.Response(text=text, status=status, content_type="text/html",
                        headers={"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"})


@dataclass
class SetupPage:
    """The registration pages and what they need: the forge, app.yml, where .env is."""

    forge: Forge
    manifest: Manifest
    env_file: Path
    org: str | None = None
    public_url: str | None = None  # None: the page's own origin (serve: the app itself)
    name: str | None = None
    public: bool | None = None
    # serve: the forge sends the browser back to the app's public URL; register: to this page
    redirect_via_public: bool = False
    # what comes before installing: the app must answer at its public URL by then (the forge
    # sends the browser to its setup URL after an installation, and webhooks to it)
    then: str = ("First run <code>vaultmail serve</code> where the app will run, beside that "
                 ".env, so that it answers at its public URL: the forge sends its webhooks "
                 "there, and your browser to its <code>/setup/installed</code> once you "
                 "install the App.")
    registered: Registered | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    key: str = field(default_factory=lambda: secrets.token_urlsafe(18))
    _browsers: set[str] = field(default_factory=set)  # the cookies of those given the page
    _states: dict[str, tuple[float, str]] = field(default_factory=dict)  # state: (at, browser)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/setup", self.setup)
        app.router.add_get("/setup/callback", self.callback)
        app.router.add_get("/setup/installed", installed_page)

    def link(self, base: str) -> str:
        """The page's address to print: only who sees it may register the App."""
        return f"{base}/setup?{urlencode({'key': self.key})}"

    def _new_state(self, browser: str) -> str:
        now = time.monotonic()
        for s, (at, _) in list(self._states.items()):
            if now - at > STATE_TTL or len(self._states) >= MAX_STATES:
                del self._states[s]
        state = secrets.token_urlsafe(24)
        self._states[state] = (now, browser)
        return state

    def _take_state(self, state: str, browser: str) -> bool:
        at, given_to = self._states.get(state, (0.0, ""))
        if not browser or not secrets.compare_digest(given_to, browser):
            return False  # not the browser it was given to: the state stays for that one
        del self._states[state]
        return time.monotonic() - at <= STATE_TTL

    def _tls(self, request: web.Request) -> bool:
        """Whether the browser is on https: a TLS request, or `serve`'s https public URL (the
        page sends the browser there first, behind an ingress that ends TLS). `register`'s
        page is on loopback whatever the App's URL."""
        return request.secure or (self.redirect_via_public and
                                  (self.public_url or "").startswith("https://"))

    def _cookie(self, request: web.Request) -> str:
        """The browser's cookie (`bot.app.cookies`: over https only its `__Host-` one)."""
        return cookies.read(request, BROWSER_COOKIE, self._tls(request)) or ""

    def _browser(self, request: web.Request) -> str | None:
        """This browser's cookie, when the page was given to it (by the key)."""
        cookie = self._cookie(request)
        return cookie if cookie in self._browsers else None

    async def setup(self, request: web.Request) -> web.Response:
        browser = self._browser(request)
        if self.registered is not None:
            return self._registered_page() if browser else _page(
                "vaultmail is registered", "<p>This deployment's App is registered.</p>")
        # (as bytes: the key is anyone's to write, and a text compare refuses what is not ASCII)
        keyed = secrets.compare_digest(request.query.get("key", "").encode(), self.key.encode())
        if browser is None and not keyed:
            return _page("Open the link vaultmail printed", (
                "<p>Registering the App decides what this deployment runs as, so this page "
                "asks for the <code>key</code> in the link vaultmail printed where it started "
                "(<code>open http://&hellip;/setup?key=&hellip;</code>): open that link.</p>"),
                403)
        origin = str(request.url.origin())
        if keyed and self.redirect_via_public and self.public_url and "moved" not in \
                request.query and urlsplit(self.public_url).netloc != request.host:
            # the forge sends the browser back to the public URL: its cookie must be there
            # (once: behind a proxy that rewrites Host, it is as good as it gets)
            raise web.HTTPFound(self.link(self.public_url) + "&moved=1")
        if browser is None:
            browser = secrets.token_urlsafe(24)
            self._browsers.add(browser)
        public = self.public_url or origin
        back = self.public_url if self.redirect_via_public and self.public_url else origin
        redirect = f"{back}/setup/callback"
        manifest = manifest_for(self.manifest, public_url=public, redirect_url=redirect,
                                name=self.name, public=self.public)
        action = (f"{self.forge.new_app_url(self.org)}?"
                  f"{urlencode({'state': self._new_state(browser)})}")
        owner = f"the organisation <b>{html.escape(self.org)}</b>" if self.org else \
            "your own account (or run with <code>--org ORG</code>)"
        events = ", ".join(manifest.get("default_events", []))
        perms = ", ".join(f"{k}: {v}" for k, v in manifest.get("default_permissions", {}).items())
        hook = manifest.get("hook_attributes", {}).get("url", "(none)")
        page = _page(f"Register {manifest['name']}", (
            f"<p>This creates a GitHub App named <b>{html.escape(manifest['name'])}</b> on "
            f"{html.escape(self.forge.web)}, owned by {owner}, from app.yml.</p><ul>"
            f"<li>permissions: {html.escape(perms)}</li><li>events: {html.escape(events)}</li>"
            f"<li>webhooks to <code>{html.escape(hook)}</code></li>"
            f"<li>{'public: any account can install it' if manifest.get('public') else 'private: only its owner can install it'}</li></ul>"  # noqa: E501
            f"<form action=\"{html.escape(action)}\" method=\"post\">"
            f"<input type=\"hidden\" name=\"manifest\" value=\"{html.escape(json.dumps(manifest))}\">"  # noqa: E501
            f"<button type=\"submit\">Register on {html.escape(self.forge.web)}</button></form>"
            "<p>The forge asks you to confirm, then sends you back here; the App's credentials "
            f"go to <code>{html.escape(str(self.env_file))}</code> (mode 0600).</p>"))
        cookies.put(page, BROWSER_COOKIE, browser, tls=self._tls(request), path="/setup",
                    max_age=int(STATE_TTL))
        return page

    async def callback(self, request: web.Request) -> web.Response:
        code, state = request.query.get("code", ""), request.query.get("state", "")
        async with self._lock:
            if self.registered is not None:  # (what it wrote where: the registering browser's)
                return self._registered_page() if self._browser(request) else _page(
                    "vaultmail is registered", "<p>This deployment's App is registered.</p>")
            if not state or not self._take_state(state, self._cookie(request)):
                return _page("Registration not started here", (
                    "<p>The <code>state</code> of this return is not one this page gave out "
                    "to this browser (or it was used already, or is over an hour old): "
                    "nothing was written. Start again at <a href=\"/setup\">/setup</a>, in "
                    "the browser that opened the link vaultmail printed.</p>"), 400)
            if not code:
                return _page("No code", "<p>The forge sent no <code>code</code>: start again "
                             "at <a href=\"/setup\">/setup</a>.</p>", 400)
            try:
                app = await convert(self.forge, code)
                written = write_env(self.env_file, credentials(app, self.forge))
            except SetupError as exc:
                return _page("Registration failed", f"<p>{html.escape(str(exc))}</p><p>"
                             "<a href=\"/setup\">Start again at /setup</a></p>", 502)
            except OSError as exc:
                return _page("Cannot write .env", (
                    f"<p>{html.escape(str(self.env_file))}: {html.escape(str(exc.strerror))}. "
                    "The App was created on the forge: delete it there, fix the file's "
                    "folder, and start again at <a href=\"/setup\">/setup</a>.</p>"), 500)
            owner = app.get("owner") or {}
            if self.org and str(owner.get("login", "")).lower() != self.org.lower():
                return _page("Registered for another account", (
                    f"<p>The forge made App <b>{html.escape(str(app.get('slug', '')))}</b> "
                    f"for {html.escape(str(owner.get('login', '')))}, not for "
                    f"{html.escape(self.org)}: nothing was written. Delete that App on the "
                    "forge, and start again at <a href=\"/setup\">/setup</a>.</p>"), 400)
            self.registered = Registered(
                app_id=int(app["id"]), slug=str(app["slug"]), name=str(app.get("name", "")),
                owner=str(owner.get("login", "")), install_url=self.forge.install_url(
                    str(app["slug"])), env=written)
            self.done.set()
            return self._registered_page()

    def _registered_page(self) -> web.Response:
        r = self.registered
        assert r is not None
        removed = (f" (taken out, superseded: {', '.join(r.env.removed)})" if r.env.removed
                   else "")
        public = self.manifest.public if self.public is None else self.public
        where = ("on the organisations whose people and agents will use it" if public else
                 f"on {html.escape(r.owner)} (a private App installs only on the account that "
                 "owns it: app.yml's <code>public: true</code>, or <code>vaultmail register "
                 "--public</code>, lets others)")
        return _page(f"{r.name or r.slug} is registered", (
            f"<p>App <b>{html.escape(r.slug)}</b> (id {r.app_id}) on "
            f"{html.escape(self.forge.web)}, owned by {html.escape(r.owner)}. Its credentials "
            f"are in <code>{html.escape(str(r.env.path))}</code> (mode 0600): "
            f"{html.escape(', '.join(r.env.written))}{html.escape(removed)}; its "
            f"{r.env.kept} other line(s) are as they were.</p>"
            f"<p>{self.then}</p>"
            f"<p>Then <a href=\"{html.escape(r.install_url)}\">install it</a> {where}, and "
            "put the office config in <code>ORG/.github/vaultmail.yml</code>.</p>"))


async def installed_page(request: web.Request) -> web.Response:
    """The App's setup URL: where the forge sends the browser after an installation."""
    inst = request.query.get("installation_id", "")
    action = request.query.get("setup_action", "install")
    what = "updated" if action == "update" else "installed"
    which = f" (installation {html.escape(inst)})" if whole(inst) is not None else ""
    return _page(f"vaultmail is {what}{which}", (
        "<p>Next: the office config, <code>vaultmail.yml</code> in the organisation's "
        "<code>.github</code> repository (the people, agents and their vaults; see "
        "<code>bot/example_office.yml</code>). vaultmail reads it at once and on every push "
        "to it.</p><p>Then make API tokens for the agents: <code>vaultmail token create "
        "agent:SLUG --org ORG</code>.</p>"))


def add_registered_pages(app: web.Application, settings: Settings) -> None:
    """`serve` once registered: /setup says so and links the install page; /setup/installed
    is the App's setup URL."""
    forge = Forge.from_api(settings.api_url)

    async def setup(request: web.Request) -> web.Response:
        from bot.app.services import SERVICES_KEY

        services = request.app.get(SERVICES_KEY)
        slug = services.app_slug if services is not None else ""
        link = (f"<a href=\"{html.escape(forge.install_url(slug))}\">install it</a>" if slug
                else "install it from the App's page on the forge")
        return _page("vaultmail is registered", (
            f"<p>This app runs as the GitHub App <b>{html.escape(slug or settings.app_id)}</b> "
            f"on {html.escape(forge.web)}: {link} on more organisations as you need.</p>"))

    app.router.add_get("/setup", setup)
    app.router.add_get("/setup/installed", installed_page)


# --------------------------------------------------------------------------------------------
# `serve` without credentials


def _setup_probes(app: web.Application, page: SetupPage) -> None:
    async def healthz(request: web.Request) -> web.Response:
        return json_response({"status": "not registered", "setup": "/setup"})

    async def readyz(request: web.Request) -> web.Response:
        return json_response({"status": "not ready", "failed": ["registered"], "checks": {
            "registered": {"ok": False, "detail": "not registered yet: open /setup"}}},
            status=503, headers=retry_headers(503))  # (registered, it serves at once)

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)


def shown_url(sock: socket.socket, host: str) -> str:
    """How to reach a listening socket from this machine."""
    port = sock.getsockname()[1]
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


async def serve_page(sock: socket.socket, page: SetupPage, stopped: Awaitable[object],
                     announce: str, probes: bool = False) -> bool:
    """Serve the registration pages on `sock` until registered (True) or `stopped` (False);
    `announce` is printed once they answer and a signal is heard. `sock` stays open for
    whoever serves on it next."""
    app = web.Application()
    page.add_routes(app)
    if probes:
        _setup_probes(app, page)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    await web.SockSite(runner, sock.dup()).start()  # a duplicate: closing it leaves `sock`
    done = asyncio.create_task(page.done.wait())
    stop = asyncio.ensure_future(stopped)
    await asyncio.sleep(0)  # `stopped` starts listening for signals
    print(announce, file=sys.stderr if probes else sys.stdout, flush=True)
    try:
        await asyncio.wait({done, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (done, stop):
            task.cancel()
        await asyncio.gather(done, stop, return_exceptions=True)
        await runner.cleanup()  # the callback's answer is sent first
    return page.registered is not None


async def serve_until_registered(sock: socket.socket, unregistered: NotRegistered,
                                 stopped: Awaitable[object]) -> bool:
    """`vaultmail serve` without credentials: the registration page on the app's own port
    (webhooks and the redirect to the app's own URL, or VAULTMAIL_PUBLIC_URL), GH_ORG for an
    organisation, the forge from GHE_HOST / GITHUB_API_URL (default github.com); .env beside
    it. True once registered (the caller then reads .env), False if stopped first."""
    page = SetupPage(
        forge=Forge.from_api(unregistered.api_url), manifest=load_manifest(),
        env_file=unregistered.env_file or Path(".env"), org=unregistered.org,
        public_url=public_url_of(unregistered.public_url, "VAULTMAIL_PUBLIC_URL")
        if unregistered.public_url else None, redirect_via_public=True,
        then="This app now carries on with it: it is serving as that App.")
    url = shown_url(sock, unregistered.host)
    return await serve_page(sock, page, stopped, probes=True, announce=(
        f"vaultmail: not registered yet: open {page.link(url)} to register the App on "
        f"{page.forge.web} (missing {', '.join(unregistered.missing)}; or set them, or run "
        "`vaultmail register`; `vaultmail up` tries vaultmail without a forge)"))
