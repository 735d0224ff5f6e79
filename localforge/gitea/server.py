"""The Gitea dialect's aiohttp application: one middleware applies credentials
(`Authorization: token|Bearer`, or `?token=` / `?access_token=`), faults, the request log and
persistence. Gitea has no API rate limiting and sends no rate-limit headers or ETags."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from aiohttp import web

from ..access import Principal
from ..faults import RouteFault
from ..github import control
from ..github.auth import authenticate
from ..github.http import CTX_KEY, FORGE_KEY, TEMPLATES_KEY, ApiError, Ctx, Handler
from ..reqlog import RequestRecord
from ..routing import add_shared_routes
from ..web import API_ROOTS, GITEA_API_ROOTS, WEB_FORGE_KEY, WEB_ROUTES, is_web_request
from ..web import register as register_web_pages
from . import routes, routes_contents, routes_deps
from .http import Routes, gitea_error, json_response

if TYPE_CHECKING:
    from ..forge import LocalForge


def _fault_response(fault: RouteFault, url: str) -> web.Response:
    if fault.kind in ("secondary_limit", "primary_limit"):  # a proxy's limit (Codeberg)
        return json_response({"message": "rate limit exceeded", "url": url},
                             fault.status if fault.status in (429, 503) else 429,
                             {"Retry-After": "60"})
    status = fault.status or 500
    return json_response({"message": "Internal Server Error", "url": url}, status)


def _credentials(request: web.Request) -> str | None:
    header = request.headers.get("Authorization")
    if header:
        return header
    token = request.query.get("token") or request.query.get("access_token")
    return f"token {token}" if token else None


@web.middleware
async def api_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    forge: LocalForge = request.app[FORGE_KEY]
    if request.path.startswith("/_forge/"):
        try:
            return await handler(request)
        except ApiError as err:
            return err.response()
    if is_web_request(request):  # the forge's HTML pages and sign-in: not the API
        return await handler(request)
    started = time.monotonic()
    template = request.app[TEMPLATES_KEY].get(request.match_info.route, "")
    route = template or f"{request.method} {request.path}"
    principal = Principal(kind="none")
    fault: RouteFault | None = None
    url = f"{forge.url}/api/swagger"
    try:
        try:
            principal = authenticate(forge, _credentials(request))
        except ApiError as exc:
            raise ApiError(401, "user does not exist") from exc
        if principal.kind not in ("none", "user"):
            raise ApiError(401, "user does not exist")
        request[CTX_KEY] = Ctx(forge, principal, request)
        owner, name = request.match_info.get("owner"), request.match_info.get("repo")
        await forge.faults.held(request.method, route.partition(" ")[2],
                                f"{owner}/{name}" if owner and name else None)
        delay, fault = forge.faults.pick(request.method, route.partition(" ")[2])
        if delay > 0:
            await asyncio.sleep(delay)
        if fault is not None and fault.mode == "fail":
            resp: web.StreamResponse = _fault_response(fault, url)
        else:
            if not template:
                raise ApiError(404, "Not Found")
            resp = await handler(request)
    except ApiError as err:
        resp = gitea_error(err, url)
    except web.HTTPException as exc:
        resp = gitea_error(ApiError(exc.status, exc.reason or "Not Found"), url)
    if fault is not None and fault.mode == "after":
        resp = _fault_response(fault, url)
    resp.headers.setdefault("Cache-Control", "max-age=0, private, must-revalidate, no-transform")
    resp.headers.setdefault("X-Content-Type-Options", "nosniff")
    forge.requests.add(RequestRecord(
        method=request.method, path=request.path_qs, route=route, status=resp.status,
        auth=principal.kind, login=principal.login, at=forge.clock.now(),
        duration=round(time.monotonic() - started, 4)))
    if request.method != "GET" and (resp.status < 400 or (fault and fault.mode == "after")):
        forge.save()
    return resp


def _routes(app: web.Application) -> None:
    """Every route of the dialect (built once a process: localforge/routing.py)."""
    app[TEMPLATES_KEY] = {}
    control.register(app)
    routes.register(Routes(app))
    routes_deps.register(Routes(app))
    routes_contents.register(Routes(app))
    # Sign-in and the pages; Gitea's own OAuth2 provider is not modelled.
    register_web_pages(app, oauth_flow=False, api_roots=GITEA_API_ROOTS)


def build_app(forge: LocalForge) -> web.Application:
    app = web.Application(middlewares=[api_middleware], client_max_size=32 * 1024 * 1024)
    add_shared_routes(app, _routes, (TEMPLATES_KEY, WEB_ROUTES, API_ROOTS))
    app[FORGE_KEY] = forge
    app[WEB_FORGE_KEY] = forge
    return app
