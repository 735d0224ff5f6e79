"""The forge's web side (what github.com serves beside api.github.com): sign-in and sessions,
GitHub's OAuth web flow for Apps, and read-only pages for the `html_url`s the API hands out.

`register(app)` adds the routes to a dialect's aiohttp application, after its API
routes; the dialect's API middleware passes a request through untouched when
`is_web_request(request)` (no rate-limit headers, ETags or request log: these are not API
calls). `signed_in(forge, request)` answers who is signed in, for any web route of the forge.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..faults import Faults
from . import oauth, pages, signin
from .html import SECURITY_HEADERS, WebError
from .session import WEB_FORGE_KEY, forge_of, set_new_csrf, signed_in, viewer

if TYPE_CHECKING:
    from ..forge import LocalForge

__all__ = ["API_ROOTS", "WEB_FORGE_KEY", "WEB_ROUTES", "is_web_request", "register",
           "signed_in"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
WEB_ROUTES: web.AppKey[dict[Any, str]] = web.AppKey("forge_web_routes", dict)
API_ROOTS: web.AppKey[frozenset[str]] = web.AppKey("forge_api_roots", frozenset)
# First path segments that belong to the GitHub API: a page path under one of them is an API
# path that does not exist, and answers the API's JSON 404.
GITHUB_API_ROOTS = frozenset({
    "api", "app", "app-manifests", "applications", "authorizations", "emojis", "events",
    "gists", "installation", "markdown", "meta", "notifications", "octocat", "orgs",
    "rate_limit", "repos", "repositories", "search", "teams", "user", "users", "zen",
    "_forge",
})
GITEA_API_ROOTS = frozenset({"api", "_forge"})


def is_web_request(request: web.Request) -> bool:
    """Whether a request was routed to one of the web pages (not to the API)."""
    routes = request.app.get(WEB_ROUTES, {})
    if request.match_info.route not in routes:
        return False
    first = request.path.lstrip("/").partition("/")[0]
    return first not in request.app.get(API_ROOTS, frozenset())


async def _faults(forge: LocalForge, method: str, template: str) -> web.Response | None:
    """Faults and holds that name a web route (`POST /login/oauth/access_token`) apply to it;
    catch-all ones (`*`) stay with the API they were written for."""
    named = [f for f in forge.faults.routes if f.route.partition(" ")[2] == template]
    holds = [x for x in forge.faults.holds if x.route.partition(" ")[2] == template]
    if holds:
        await Faults(holds=holds).held(method, template)
        forge.faults.holds = [x for x in forge.faults.holds
                              if not x.released.is_set() and (x.count is None
                                                              or x.caught < x.count)]
    if not named:
        return None
    delay, fault = Faults(routes=named, rng=forge.faults.rng).pick(method, template)
    forge.faults.routes = [f for f in forge.faults.routes
                           if f.count is None or f.fired < f.count]
    if delay > 0:
        await asyncio.sleep(delay)
    if fault is None:
        return None
    status = fault.status or 502
    return web.Response(status=status, text=f"{status}: the forge was told to fail "
                        f"{method} {template} (fault injection).", content_type="text/plain")


def _guard(handler: Handler, template: str) -> Handler:
    """What every web route shares: faults, error pages, security headers, the CSRF cookie a
    form page made, persistence after a POST."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        forge = forge_of(request)
        failed = await _faults(forge, request.method, template)
        if failed is not None:
            return failed
        try:
            resp = await handler(request)
        except WebError as err:
            try:
                login = viewer(request).login
            except WebError:
                login = None
            resp = err.render(request, login)
        for key, value in SECURITY_HEADERS.items():
            resp.headers.setdefault(key, value)
        set_new_csrf(request, resp)
        if request.method == "POST":
            forge.save()
        return resp

    return wrapped


def register(app: web.Application, oauth_flow: bool = True,
             api_roots: frozenset[str] = GITHUB_API_ROOTS) -> None:
    """Add the web routes; call it after the API's routes (those take precedence). The
    dialect's build_app puts the forge under WEB_FORGE_KEY (the routes are shared: routing.py)."""
    app[API_ROOTS] = api_roots
    routes: dict[Any, str] = {}
    table: list[tuple[str, str, Handler]] = [
        ("GET", "/login", signin.login_page),
        ("POST", "/session", signin.create_session),
        ("GET", "/logout", signin.logout_page),
        ("POST", "/logout", signin.logout),
    ]
    if oauth_flow:
        table += [
            ("GET", "/login/oauth/authorize", oauth.authorize),
            ("POST", "/login/oauth/authorize", oauth.authorize_decision),
            ("POST", "/login/oauth/access_token", oauth.access_token),
        ]
    table += [
        ("GET", "/", pages.home),
        ("GET", "/apps/{slug}", pages.app_page),
        ("GET", "/organizations/{org}/settings/installations/{id}", pages.installation),
        ("GET", "/settings/installations/{id}", pages.installation),
        ("GET", "/avatars/u/{id}", pages.avatar),
        ("GET", "/avatars/{id}", pages.avatar),  # Gitea's form
        ("GET", "/{owner}", pages.account),
        ("GET", "/{owner}/{repo}", pages.repository),
        ("GET", "/{owner}/{repo}/issues", pages.issues),
        ("GET", "/{owner}/{repo}/issues/{number}", pages.issue),
        ("GET", "/{owner}/{repo}/blob/{ref}/{path:.+}", pages.blob),
        ("GET", "/{owner}/{repo}/tree/{ref}", pages.tree),
        ("GET", "/{owner}/{repo}/tree/{ref}/{path:.+}", pages.tree),
        ("GET", "/{owner}/{repo}/raw/{ref}/{path:.+}", pages.raw),
    ]
    for method, path, handler in table:
        route = app.router.add_route(method, path, _guard(handler, path))
        routes[route] = f"{method} {path}"
    app.router.add_get("/_forge/users/{login}/password", signin.user_password)
    app[WEB_ROUTES] = routes
