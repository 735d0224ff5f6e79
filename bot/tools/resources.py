"""Mail threads, items and the inbox as MCP resources, read through the tools' own code.

`vaultmail://mail/{owner}/{repo}/{n}` is what `mail_get` returns for that mail,
`vaultmail://item/{owner}/{repo}/{n}` the item with its open threads (and, for a goal, what
`get_tree` returns; for an outcome, what `get_outcome` returns), `vaultmail://inbox` what
`list_inbox` returns, looked at without marking anything read (and, for an agent, its `inbox`).
Each read runs as the caller, so it sees exactly what the tools would show it
(`bot.office.visibility`): a resource one may not see is as unknown as one that is not there.

The inbox can be watched: `wait_inbox_change` sleeps on the app's `Notifier` (the wake-ups of
`list_inbox` with `wait`, no polling) and returns once the inbox reads differently from the
digest the watcher last saw; comparing digests means a change between two waits is never
lost. MCP subscriptions (`bot.tools.mcp_server`) and `vaultmail mcp` over stdio, through
`GET /api/v1/resources/wait` here, both watch with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import re
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from aiohttp import web

from bot.app.bodies import json_response
from bot.app.peers import client_key
from bot.app.services import SERVICES_KEY, Services
from bot.errors import InvalidArguments, VaultmailError, forge_refusal, refusal_headers
from bot.forge.errors import ForgeError
from bot.items import inbox
from bot.items.views import hidden_claims, item_view, thread_view
from bot.office.visibility import viewer_for
from bot.store import comments as db
from bot.tools.comment_tools import comments_for
from bot.tools.http import bearer_call, unless_gone
from bot.tools.registry import TOOLS, Call, agent_inbox

INBOX_URI = "vaultmail://inbox"
MIME = "application/json"
MAX_WAIT = 50  # seconds one HTTP wait may hold, like list_inbox's `wait`
_URI = re.compile(r"^vaultmail://(?P<kind>mail|item)/(?P<owner>[A-Za-z0-9_.-]{1,100})/"
                  r"(?P<repo>[A-Za-z0-9_.-]{1,100})/(?P<n>[1-9][0-9]{0,9})$")
LISTED_ITEMS = 50  # items listed besides the inbox and the newest mail


@dataclass(frozen=True)
class ResourceInfo:
    uri: str
    name: str
    title: str
    description: str
    mimeType: str = MIME

    def as_json(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class TemplateInfo:
    uriTemplate: str
    name: str
    title: str
    description: str
    mimeType: str = MIME

    def as_json(self) -> dict[str, str]:
        return asdict(self)


INBOX = ResourceInfo(
    INBOX_URI, "inbox", "Your inbox",
    "What list_inbox returns, looked at without marking anything read; subscribe to hear "
    "when it changes.")
TEMPLATES = [
    TemplateInfo("vaultmail://mail/{owner}/{repo}/{n}", "mail", "A mail and its thread",
                 "What mail_get returns for the mail at owner/repo#n: the mail, its comments "
                 "and the linked mails in other vaults."),
    TemplateInfo("vaultmail://item/{owner}/{repo}/{n}", "item", "An item and its threads",
                 "The goal, outcome, plan or evidence at owner/repo#n with its open threads; a "
                 "goal with the items under it, an outcome with its decisions."),
]


def mail_uri(ref: str) -> str:
    repo, _, n = ref.partition("#")
    return f"vaultmail://mail/{repo}/{n}"


def item_uri(ref: str) -> str:
    repo, _, n = ref.partition("#")
    return f"vaultmail://item/{repo}/{n}"


async def _run(call: Call, tool: str, **args: Any) -> dict[str, Any]:
    """A tool's own function, as the caller, without what `call_tool` adds around a call (the
    `inbox` field, whose look marks an agent's share seen): a resource read changes nothing."""
    spec = TOOLS[tool]
    try:
        return await spec.fn(call, spec.args.model_validate(args))
    except ForgeError as exc:
        raise forge_refusal(exc, tool) from exc


async def list_resources(call: Call) -> list[ResourceInfo]:
    """The inbox, the caller's newest mail, and the items that concern it."""
    found = [INBOX]
    for m in (await _run(call, "mail_list"))["mails"]:
        found.append(ResourceInfo(mail_uri(m["ref"]), f"mail {m['ref']}", str(m["subject"]),
                                  f"mail from {m['from_principal']} to {m['to_principal']} "
                                  f"({m['state']})"))
    store, office = call.services.store, call.office
    refs = await inbox.relevant_items(store, office, inbox.Whose.of(office, call.principal))
    shown = await viewer_for(call).visible(refs[:LISTED_ITEMS])
    for ref in refs[:LISTED_ITEMS]:
        item = await db.get_item(store, ref) if ref in shown else None
        if item is not None:
            found.append(ResourceInfo(item_uri(ref), f"{item.kind} {ref}", item.title,
                                      f"the {item.kind} {ref} and its threads"))
    return found


async def read_inbox(call: Call) -> dict[str, Any]:
    content = await _run(call, "list_inbox", markRead=False)
    if call.is_agent:
        content["inbox"] = await agent_inbox(call)
    return content


async def read_resource(call: Call, uri: str) -> dict[str, Any]:
    """What the resource at `uri` holds for the caller (NotFoundError if it may not see it)."""
    if uri == INBOX_URI:
        return await read_inbox(call)
    m = _URI.match(uri)
    if m is None:
        raise InvalidArguments(f"uri: {uri[:120]!r} is not a vaultmail resource; they are "
                               f"{INBOX_URI}, vaultmail://mail/OWNER/REPO/N and "
                               "vaultmail://item/OWNER/REPO/N")
    ref = f"{m['owner']}/{m['repo']}#{m['n']}"
    if m["kind"] == "mail":
        return await _run(call, "mail_get", mail=ref)
    viewer = viewer_for(call)
    try:
        item = await comments_for(call).target(ref, None, viewer)
    except ForgeError as exc:
        raise forge_refusal(exc, uri) from exc
    if item.kind == "goal":
        content = await _run(call, "get_tree", goal=ref)
    elif item.kind == "outcome":
        content = await _run(call, "get_outcome", outcome=ref)
    else:
        content = {"item": await item_view(item, viewer)}
    threads = await db.open_threads(call.services.store, item=item.ref)
    hidden = await hidden_claims(call.services.store, threads, viewer.visible)
    return {**content, "threads": [thread_view(t, call.principal, hidden=hidden.get(t.id))
                                   for t in threads]}


def digest(content: Any) -> str:
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()


CallFor = Callable[[], Awaitable[Call]]


async def wait_inbox_change(services: Services, call_for: CallFor, after: str | None,
                            timeout: float) -> tuple[bool, str]:
    """Wait at most `timeout` seconds until the inbox reads differently from `after` (its
    digest): (changed, the digest now). Without `after`, the digest now, at once.

    Each round registers on the notifier before it reads, so a change made while it reads
    still wakes it; `call_for` is asked each round (a revoked token ends the wait)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        call = await call_for()
        keys = inbox.wait_keys(call.office, call.principal) | {call.principal}
        waiter = asyncio.ensure_future(
            services.notifier.wait_any(keys, max(deadline - loop.time(), 0),
                                       org=call.office.org))
        await asyncio.sleep(0)  # registered before the look
        try:
            now = digest(await read_inbox(call))
            if after is None or now != after:
                if after is not None:  # something to tell: the token must still act for
                    await call_for()  # them now (revoked between the round's look and this
                    # read, it hears nothing more)
                return after is not None, now
            if not await waiter:  # timed out, or the app is stopping
                return False, now
        finally:
            if not waiter.done():
                waiter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await waiter


# -- over HTTP, for `vaultmail mcp` on stdio ------------------------------------------------

async def _caller(request: web.Request) -> Call:
    services = request.app[SERVICES_KEY]
    return await bearer_call(services, request.headers.get("Authorization"),
                             client_key(request, services.settings.trusted_proxies))


class Stopping(VaultmailError):
    status = 503
    code = "stopping"


def _error(exc: VaultmailError) -> web.Response:
    return json_response(exc.as_json(), status=exc.status, headers=refusal_headers(exc))


async def me(request: web.Request) -> web.Response:
    """Who the token acts for: `vaultmail mcp` asks this before it starts."""
    try:
        call = await _caller(request)
    except VaultmailError as exc:
        return _error(exc)
    return json_response({"principal": call.principal, "org": call.office.org})


async def resources_endpoint(request: web.Request) -> web.Response:
    try:
        call = await _caller(request)
        listed = await list_resources(call)
    except VaultmailError as exc:
        return _error(exc)
    return json_response({"resources": [r.as_json() for r in listed],
                              "templates": [t.as_json() for t in TEMPLATES]})


async def read_endpoint(request: web.Request) -> web.Response:
    uri = request.query.get("uri", "")
    try:
        content = await read_resource(await _caller(request), uri)
    except VaultmailError as exc:
        return _error(exc)
    return json_response({"uri": uri, "mimeType": MIME, "content": content})


async def wait_endpoint(request: web.Request) -> web.StreamResponse:
    """`?uri=vaultmail://inbox&after=DIGEST&wait=SECONDS`: answers once the inbox reads
    differently from DIGEST (or after `wait`, at most 50 s): {changed, digest}."""
    services = request.app[SERVICES_KEY]
    try:
        if services.notifier.closed:
            raise Stopping("the app is stopping; wait again once it is back")
        if request.query.get("uri", INBOX_URI) != INBOX_URI:
            raise InvalidArguments(f"uri: only {INBOX_URI} can be watched")
        try:
            wait = float(request.query.get("wait", "0"))
        except ValueError:
            wait = math.nan
        if math.isnan(wait):  # (NaN passed the clamp below, and the loop's timer failed on it)
            raise InvalidArguments("wait: a number of seconds, at most 50")
        wait = min(max(wait, 0.0), MAX_WAIT)
        call = await _caller(request)  # refused at once, before holding anything
        after = request.query.get("after") or None
        with services.long_polls.hold(call.token_key, "resources/wait", {"wait": wait},
                                      (call.office.org, call.principal)):
            found = await unless_gone(request, wait_inbox_change(
                services, lambda: _caller(request), after, wait))
    except VaultmailError as exc:
        return _error(exc)
    if found is None:  # the client went away
        return web.Response(status=499)
    changed, now = found
    return json_response({"changed": changed, "digest": now})


def add_resource_routes(app: web.Application) -> None:
    app.router.add_get("/api/v1/me", me)
    app.router.add_get("/api/v1/resources", resources_endpoint)
    app.router.add_get("/api/v1/resources/read", read_endpoint)
    app.router.add_get("/api/v1/resources/wait", wait_endpoint)
