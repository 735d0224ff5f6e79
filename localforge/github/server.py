"""The GitHub dialect's aiohttp application: one middleware applies what GitHub applies to
every API request (credentials, faults, primary and secondary limits, ETags, rate-limit
headers, the request log, persistence)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
from typing import TYPE_CHECKING

from aiohttp import web

from ..access import Principal
from ..faults import RouteFault
from ..limits import Window
from ..reqlog import RequestRecord
from ..routing import add_shared_routes
from ..state import Repo
from ..web import API_ROOTS, WEB_FORGE_KEY, WEB_ROUTES, is_web_request
from ..web import register as register_web_pages
from . import (
    control,
    routes_apps,
    routes_comments,
    routes_contents,
    routes_fields,
    routes_issues,
    routes_labels,
    routes_manifest,
    routes_misc,
    routes_pulls,
    routes_repos,
    routes_user,
    routes_work,
    versions,
)
from .auth import authenticate
from .http import (
    CTX_KEY,
    FORGE_KEY,
    TEMPLATES_KEY,
    VERSION_KEY,
    ApiError,
    Ctx,
    Handler,
    Routes,
    json_response,
)

if TYPE_CHECKING:
    from ..forge import LocalForge

CREATION_ROUTES = {
    "POST /repos/{owner}/{repo}/issues",
    "POST /repos/{owner}/{repo}/issues/{issue_number}/comments",
    # "Creating content too quickly using this endpoint may result in secondary rate limiting"
    "POST /repos/{owner}/{repo}/issues/{issue_number}/sub_issues",
    "POST /repos/{owner}/{repo}/issues/{issue_number}/dependencies/blocked_by",
    "POST /repos/{owner}/{repo}/issues/{issue_number}/issue-field-values",
    "PUT /repos/{owner}/{repo}/issues/{issue_number}/issue-field-values",
    "POST /repos/{owner}/{repo}/check-runs",
}
SECONDARY_MESSAGE = (
    "You have exceeded a secondary rate limit. Please wait a few minutes before you try "
    "again. If you reach out to GitHub Support for help, please include the request ID."
)
SECONDARY_DOCS = ("https://docs.github.com/rest/overview/rate-limits-for-the-rest-api"
                  "#about-secondary-rate-limits")
UNMETERED = {"GET /rate_limit"}


def rate_headers(w: Window, resource: str) -> dict[str, str]:
    return {
        "X-RateLimit-Limit": str(w.limit), "X-RateLimit-Remaining": str(w.remaining),
        "X-RateLimit-Used": str(w.used), "X-RateLimit-Reset": str(int(w.reset)),
        "X-RateLimit-Resource": resource,
    }


def _fault_response(forge: LocalForge, fault: RouteFault, key: str) -> web.Response:
    if fault.kind == "secondary_limit":
        return json_response({"message": SECONDARY_MESSAGE, "documentation_url": SECONDARY_DOCS,
                              "status": "403"}, fault.status or 403,
                             {"Retry-After": str(fault.retry_after)})
    if fault.kind == "primary_limit":
        return json_response({"message": f"API rate limit exceeded for {key}.",
                              "documentation_url": DOCS_LIMITS, "status": "403"}, 403)
    status = fault.status or 502
    message = {500: "Server Error", 502: "Server Error", 503: "Service Unavailable",
               504: "We couldn't respond to your request in time."}.get(status, "Server Error")
    return json_response({"message": message, "documentation_url": "", "status": str(status)},
                         status)


class SecondaryLimited(Exception):
    def __init__(self, wait: int | None) -> None:
        super().__init__(wait)
        self.wait = wait


def _secondary(wait: int | None) -> web.Response:
    """GitHub's secondary-limit refusal: 403, its message, `Retry-After` when it gives one."""
    return json_response({"message": SECONDARY_MESSAGE, "documentation_url": SECONDARY_DOCS,
                          "status": "403"}, 403,
                         {"Retry-After": str(wait)} if wait is not None else None)


DOCS_LIMITS = ("https://docs.github.com/rest/overview/rate-limits-for-the-rest-api"
               "#about-the-primary-rate-limit")


def _etag(request: web.Request, body: bytes) -> str:
    """GitHub's ETag, as reverse-engineered (github.com/bored-engineer/github-conditional-http-
    transport, confirmed by GitHub support in eclipse-csi/otterdog#201): SHA-256 over the values
    of Accept, Authorization and Cookie (those present, each followed by ':'), then the body.
    So a new token (an installation's every hour) gets new ETags for the same content."""
    h = hashlib.sha256()
    for name in ("Accept", "Authorization", "Cookie"):
        for value in request.headers.getall(name, []):
            h.update(value.encode() + b":")
    h.update(body)
    return f'W/"{h.hexdigest()}"'


def _etag_matches(header: str | None, etag: str) -> bool:
    if not header:
        return False
    bare = etag.removeprefix("W/")
    return any(tag.strip().removeprefix("W/") in (bare, "*") for tag in header.split(","))


def _before_loss(forge: LocalForge, request: web.Request) -> tuple[Repo, Repo] | None:
    """The repository a write about to be lost touches, and a copy of it as it is now."""
    owner, name = request.match_info.get("owner"), request.match_info.get("repo")
    repo = forge.state.repo(owner, name) if owner and name else None
    return (repo, repo.model_copy(deep=True)) if repo is not None else None


def _lose(repo: Repo, before: Repo) -> None:
    """A write acknowledged, then lost: the repository's issues and comments go back to how
    they were (the timeline events it recorded with them); issue numbers, ids and labels
    the write created stay used, as a failed-over store's sequences do."""
    repo.issues, repo.comments = before.issues, before.comments


@web.middleware
async def api_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    forge: LocalForge = request.app[FORGE_KEY]
    if request.path.startswith("/_forge/"):
        try:
            return await handler(request)
        except ApiError as err:
            return err.response()
    if routes_manifest.is_web(request) or is_web_request(request):  # HTML pages: not the API
        return await handler(request)
    started = time.monotonic()
    template = request.app[TEMPLATES_KEY].get(request.match_info.route, "")
    route = template or f"{request.method} {request.path}"
    resource = "search" if template.startswith("GET /search/") else "core"
    principal = Principal(kind="none")
    fault: RouteFault | None = None
    spend = route not in UNMETERED
    in_flight: str | None = None
    try:
        request[VERSION_KEY] = versions.select(request.headers.get(versions.HEADER))
        principal = authenticate(forge, request.headers.get("Authorization"))
        request[CTX_KEY] = Ctx(forge, principal, request)
        if template:  # secondary limit: requests in flight (held and delayed ones too)
            if not forge.rates.enter(principal.rate_key):
                raise SecondaryLimited(None)  # no retry-after: clients wait a minute
            in_flight = principal.rate_key
        owner, name = request.match_info.get("owner"), request.match_info.get("repo")
        repo = f"{owner}/{name}" if owner and name else None
        await forge.faults.held(request.method, route.partition(" ")[2], repo)
        delay, fault = forge.faults.pick(request.method, route.partition(" ")[2],
                                         principal.login, repo)
        if delay > 0:
            await asyncio.sleep(delay)
        window = forge.rates.window(principal.rate_key, resource)
        if fault is not None and fault.mode == "fail":
            resp: web.StreamResponse = _fault_response(forge, fault, principal.rate_key)
            if fault.kind == "primary_limit":
                window.used = max(window.used, window.limit)
        elif spend and window.remaining <= 0:
            resp = json_response({
                "message": f"API rate limit exceeded for {principal.rate_key}. (But here's "
                           "the good news: Authenticated requests get a higher rate limit.)",
                "documentation_url": DOCS_LIMITS, "status": "403"}, 403)
            spend = False
        elif template and (wait := forge.rates.take_points(
                principal.rate_key, request.method, route)) is not None:
            resp = _secondary(wait)
        elif route in CREATION_ROUTES and (
                wait := forge.rates.secondary_retry_after(principal.rate_key)) is not None:
            forge.rates.refused["content_creation"] += 1
            resp = _secondary(wait)
        else:
            if not template:
                raise ApiError(404, "Not Found")
            lost = _before_loss(forge, request) if fault is not None and \
                fault.mode == "lost" else None
            resp = await handler(request)
            if lost is not None and resp.status < 400:
                _lose(*lost)
            if route in CREATION_ROUTES and resp.status == 201:
                forge.rates.record_creation(principal.rate_key)
    except versions.UnsupportedVersion as exc:
        resp = ApiError(400, str(exc)).response()
    except SecondaryLimited as exc:
        resp = _secondary(exc.wait)
    except ApiError as err:
        resp = err.response()
    except web.HTTPException as exc:
        resp = ApiError(exc.status, exc.reason or "Not Found").response()
    finally:
        if in_flight is not None:
            forge.rates.leave(in_flight)
    version = request.get(VERSION_KEY, versions.DEFAULT)
    if (version != versions.DEFAULT and resp.status < 400 and isinstance(resp, web.Response)
            and resp.content_type == "application/json" and isinstance(resp.body, bytes)):
        # the routes render 2022-11-28's shapes; a newer version's answer drops what it dropped
        resp.body = json.dumps(versions.shape(version, json.loads(resp.body)),
                               ensure_ascii=False).encode()
    if (request.method == "GET" and resp.status == 200 and isinstance(resp, web.Response)
            and isinstance(resp.body, bytes)):
        tag = _etag(request, resp.body)
        if _etag_matches(request.headers.get("If-None-Match"), tag):
            resp = web.Response(status=304)
            spend = False
        resp.headers["ETag"] = tag
    if fault is not None and fault.mode == "after":
        resp = _fault_response(forge, fault, principal.rate_key)
    window = forge.rates.spend(principal.rate_key, resource) if spend else \
        forge.rates.window(principal.rate_key, resource)
    resp.headers.update(rate_headers(window, resource))
    resp.headers.setdefault("X-GitHub-Media-Type", "github.v3; format=json")
    resp.headers.setdefault("X-GitHub-Api-Version-Selected", version)
    resp.headers.setdefault("X-GitHub-Request-Id", uuid.uuid4().hex[:20].upper())
    resp.headers.setdefault("Vary", "Accept, Authorization, Cookie, X-GitHub-OTP")
    forge.requests.add(RequestRecord(
        method=request.method, path=request.path_qs, route=route, status=resp.status,
        auth=principal.kind, login=principal.login, at=forge.clock.now(),
        duration=round(time.monotonic() - started, 4),
        installation_id=principal.installation.id if principal.installation else None,
    ))
    if request.method != "GET" and (resp.status < 400 or (fault and fault.mode == "after")):
        forge.save()
    return resp


def _routes(app: web.Application) -> None:
    """Every route of the dialect (built once a process: localforge/routing.py)."""
    app[TEMPLATES_KEY] = {}
    routes = Routes(app)
    control.register(app)
    for module in (routes_apps, routes_repos, routes_labels, routes_comments, routes_issues,
                   routes_misc, routes_contents, routes_manifest, routes_user, routes_work,
                   routes_fields, routes_pulls):
        module.register(routes)
    routes_manifest.register_web(app)
    register_web_pages(app)  # last: its /{owner}/{repo} patterns yield to the API


def build_app(forge: LocalForge) -> web.Application:
    app = web.Application(middlewares=[api_middleware], client_max_size=32 * 1024 * 1024)
    add_shared_routes(app, _routes, (TEMPLATES_KEY, routes_manifest.WEB_ROUTES_KEY,
                                     WEB_ROUTES, API_ROOTS))
    app[FORGE_KEY] = forge
    app[WEB_FORGE_KEY] = forge
    app[routes_manifest.PENDING_KEY] = {}  # (this forge's own)
    return app
