"""Request plumbing shared by the GitHub routes: context, errors, JSON, pagination, routing."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlencode

from aiohttp import web

from ..access import Principal, app_level, at_least, level, visible
from ..state import Issue, Repo
from . import versions
from .render import Renderer

if TYPE_CHECKING:
    from ..forge import LocalForge

DOCS = "https://docs.github.com/rest"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
T = TypeVar("T")
FORGE_KEY: web.AppKey[LocalForge] = web.AppKey("forge")
TEMPLATES_KEY: web.AppKey[dict[Any, str]] = web.AppKey("templates")


class ApiError(Exception):
    def __init__(self, status: int, message: str, errors: list[Any] | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.errors = errors
        self.headers = headers or {}

    def response(self) -> web.Response:
        body: dict[str, Any] = {"message": self.message, "documentation_url": DOCS,
                                "status": str(self.status)}
        if self.errors is not None:
            body["errors"] = self.errors
        return json_response(body, self.status, self.headers)


def not_found() -> ApiError:
    return ApiError(404, "Not Found")


def forbidden(p: Principal, what: str = "") -> ApiError:
    if p.kind == "installation" or p.user_via_app:
        return ApiError(403, "Resource not accessible by integration")
    return ApiError(403, what or "Must have push access to this repository.")


def invalid(resource: str, field: str, code: str = "invalid",
            message: str = "Validation Failed") -> ApiError:
    return ApiError(422, message, [{"resource": resource, "field": field, "code": code}])


# GitHub refuses an issue or comment body longer than this (counted in characters)
MAX_BODY = 65_536


def check_body_length(resource: str, text: str | None) -> None:
    """GitHub's 422 for an issue or comment body over 65,536 characters."""
    if text is not None and len(text) > MAX_BODY:
        raise ApiError(422, "Validation Failed", [
            {"resource": resource, "code": "custom", "field": "body",
             "message": f"body is too long (maximum is {MAX_BODY} characters)"}])


def json_response(data: Any, status: int = 200,
                  headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=json.dumps(data, ensure_ascii=False).encode(), status=status,
        content_type="application/json", charset="utf-8", headers=headers,
    )


@dataclass
class Ctx:
    forge: LocalForge
    principal: Principal
    request: web.Request

    @property
    def version(self) -> str:
        """The REST API version this request is answered in (X-GitHub-Api-Version)."""
        return str(self.request.get(VERSION_KEY, versions.DEFAULT))

    @property
    def r(self) -> Renderer:
        return Renderer(self.forge)

    @property
    def sender(self) -> str:
        """The login that appears as the actor of a write (the bot for installations)."""
        assert self.principal.login is not None
        return self.principal.login

    @staticmethod
    def of(request: web.Request) -> Ctx:
        return request[CTX_KEY]

    async def body(self) -> dict[str, Any]:
        if not self.request.can_read_body:
            return {}
        try:
            data = await self.request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ApiError(400, "Problems parsing JSON") from exc
        if data is None:
            return {}
        if not isinstance(data, dict):
            raise ApiError(400, "Problems parsing JSON")
        return data

    def require_auth(self) -> None:
        if self.principal.kind == "none":
            raise ApiError(401, "Requires authentication")
        if self.principal.kind == "app":
            raise ApiError(403, "Resource not accessible by integration")

    # -- repositories and issues -------------------------------------------------------
    def repo(self, scope: str = "issues", need: str = "read", *,
             archived_ok: bool = False) -> Repo:
        """The repository of the route, 404 when not visible, 403 without `need` on `scope`;
        403 for a write to an archived repository (GitHub's words), unless `archived_ok`."""
        mi = self.request.match_info
        st = self.forge.state
        if self.principal.kind == "app":
            raise ApiError(403, "Resource not accessible by integration")
        repo: Repo | None
        if "repository_id" in mi:
            try:
                repo = st.repos.get(int(mi["repository_id"]))
            except ValueError:
                repo = None
        else:
            repo = st.repo(mi["owner"], mi["repo"])
            moved = st.repos.get(st.moved.get(f"{mi['owner']}/{mi['repo']}".lower(), -1))
            if repo is None and moved is not None and visible(st, self.principal, moved):
                raise self._moved(moved)
        if repo is None or not visible(st, self.principal, repo):
            raise not_found()
        if not at_least(level(st, self.principal, repo, scope), need):
            if self.principal.kind == "none":
                raise not_found()
            raise forbidden(self.principal)
        if (self.principal.user_via_app and self.request.method not in ("GET", "HEAD")
                and not at_least(app_level(st, self.principal, repo, scope), "write")):
            raise forbidden(self.principal)  # a user token writes only where the App may
        if repo.archived and not archived_ok and self.request.method not in ("GET", "HEAD"):
            raise ApiError(403, "Repository was archived so is read-only.")
        return repo

    def _moved(self, repo: Repo) -> ApiError:
        """GitHub's answer at a renamed repository's old URL: 301 (a read) or 307 to the
        same path under /repositories/{id}. Gitea's (RedirectToRepo, RedirectToUser): 307
        to the same path under the name now, as an absolute path."""
        if self.forge.dialect_name == "gitea":
            mi = self.request.match_info
            path = self.request.path.replace(f"/{mi['owner']}/{mi['repo']}",
                                             f"/{repo.full_name}", 1)
            query = f"?{self.request.query_string}" if self.request.query_string else ""
            return ApiError(307, "Temporary Redirect", headers={"Location": path + query})
        head, _, rest = self.request.path.partition("/repos/")
        tail = rest.split("/", 2)[2] if rest.count("/") >= 2 else ""
        url = f"{self.forge.url}{head}/repositories/{repo.id}" + (f"/{tail}" if tail else "")
        if self.request.query_string:
            url += "?" + self.request.query_string
        status = 301 if self.request.method in ("GET", "HEAD") else 307
        return ApiError(status, "Moved Permanently", headers={"Location": url})

    def role(self, repo: Repo, scope: str = "issues") -> str | None:
        return level(self.forge.state, self.principal, repo, scope)

    def issue(self, repo: Repo) -> Issue:
        try:
            number = int(self.request.match_info["issue_number"])
        except ValueError as exc:
            raise not_found() from exc
        issue = repo.issues.get(number)
        if issue is None:
            raise not_found()
        return issue


CTX_KEY: web.RequestKey[Ctx] = web.RequestKey("ctx", Ctx)
VERSION_KEY: web.RequestKey[str] = web.RequestKey("api_version", str)


def int_param(request: web.Request, name: str, default: int) -> int:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise invalid("Query", name) from exc


def paginate(request: web.Request, items: Sequence[T], base_url: str,
             extra_headers: dict[str, str] | None = None) -> tuple[list[T], dict[str, str]]:
    """Slice by page/per_page (max 100, default 30) and build GitHub's Link header."""
    per_page = max(1, min(100, int_param(request, "per_page", 30)))
    page = max(1, int_param(request, "page", 1))
    total = len(items)
    last = max(1, -(-total // per_page))
    start = (page - 1) * per_page
    chunk = list(items[start:start + per_page])
    headers = dict(extra_headers or {})
    query = {k: v for k, v in request.query.items() if k not in ("page", "per_page")}

    def link(p: int) -> str:
        q = dict(query)
        q["per_page"] = str(per_page)
        q["page"] = str(p)
        return f"<{base_url}{request.path}?{urlencode(q)}>"

    links = []
    if page < last:
        links.append(f'{link(page + 1)}; rel="next"')
        links.append(f'{link(last)}; rel="last"')
    if page > 1:
        links.append(f'{link(1)}; rel="first"')
        links.append(f'{link(min(page - 1, last))}; rel="prev"')
    if links:
        headers["Link"] = ", ".join(links)
    return chunk, headers


class Routes:
    """Registers each route under GitHub's paths, the /repositories/{id} form GitHub uses in
    pagination links, and an /api/v3 prefix (GitHub Enterprise's form, which Probot uses)."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.templates: dict[Any, str] = app[TEMPLATES_KEY]

    def add(self, method: str, path: str, handler: Handler) -> None:
        template = f"{method} {path}"
        paths = [path]
        if path.startswith("/repos/{owner}/{repo}"):
            paths.append("/repositories/{repository_id}" + path[len("/repos/{owner}/{repo}"):])
        for p in list(paths):
            paths.append("/api/v3" + p)
        for p in paths:
            route = self.app.router.add_route(method, p.replace("{path}", "{path:.+}")
                                              .replace("{name}", "{name:.+}"), handler)
            self.templates[route] = template
