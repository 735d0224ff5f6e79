"""Request plumbing of the Gitea dialect: errors in Gitea's shape, page/limit pagination
(at most 50, `Link` + `X-Total-Count`), route registration under /api/v1."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TypeVar
from urllib.parse import urlencode

from aiohttp import web

from ..github.http import TEMPLATES_KEY, ApiError, Ctx, Handler, int_param, invalid
from ..reqlog import BodySent
from ..state import Issue, Repo
from .render import API

T = TypeVar("T")
MAX_RESPONSE_ITEMS = 50  # [api] MAX_RESPONSE_ITEMS
DEFAULT_PAGING_NUM = 30  # [api] DEFAULT_PAGING_NUM
MESSAGES = {401: "token is required", 403: "Forbidden",
            404: "The target couldn't be found.", 422: "Unprocessable Entity"}


def gitea_error(err: ApiError, url: str) -> web.Response:
    """Gitea answers errors as {"message", "url"} (404s also carry "errors": null)."""
    message = err.message
    if err.status == 404:
        message = MESSAGES[404]
    body: dict[str, Any] = {"message": message, "url": url}
    if err.status == 404:
        body["errors"] = None
    if err.errors:
        body["message"] = f"{message}: {err.errors}"
    return json_response(body, err.status, err.headers)


STREAMED_OVER = 1024 * 1024  # bytes of JSON past which an answer goes out in chunks
CHUNK = 64 * 1024


async def streamed_json(request: web.Request, data: Any,
                        sent: list[BodySent]) -> web.StreamResponse:
    """`data` as JSON, in chunks when it is large: Gitea encodes straight into the response,
    so a big answer has no Content-Length and a client may stop reading it part way. What
    went out is recorded in `sent` (a BodySent, appended)."""
    body = json.dumps(data, ensure_ascii=False).encode()
    if len(body) <= STREAMED_OVER:
        return web.Response(body=body, content_type="application/json", charset="utf-8")
    record = BodySent(request.path, len(body))
    sent.append(record)
    response = web.StreamResponse(headers={"Content-Type": "application/json;charset=utf-8"})
    response.enable_chunked_encoding()
    try:
        await response.prepare(request)
        view = memoryview(body)
        for start in range(0, len(body), CHUNK):
            await response.write(view[start:start + CHUNK])  # waits while the client is full
            record.sent += len(view[start:start + CHUNK])
        await response.write_eof()
        record.whole = True
    except ConnectionError:  # the client closed the connection before the end
        pass
    finally:
        record.ended.set()
    return response


def json_response(data: Any, status: int = 200,
                  headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=json.dumps(data, ensure_ascii=False).encode(), status=status,
                        content_type="application/json", charset="utf-8", headers=headers)


def paginate(request: web.Request, items: Sequence[T], base_url: str,
             ) -> tuple[list[T], dict[str, str]]:
    """Slice by page (1-based) and limit (default 30, clamped to 50), Gitea's Link header
    (next, last, first, prev) and X-Total-Count."""
    limit = int_param(request, "limit", 0) or int_param(request, "per_page", 0)
    limit = DEFAULT_PAGING_NUM if limit <= 0 else min(limit, MAX_RESPONSE_ITEMS)
    page = max(1, int_param(request, "page", 1))
    total = len(items)
    last = max(1, -(-total // limit))
    chunk = list(items[(page - 1) * limit: page * limit])
    query = {k: v for k, v in request.query.items() if k not in ("page", "limit", "per_page")}

    def link(p: int, rel: str) -> str:
        q = dict(query)
        q["limit"] = str(limit)
        q["page"] = str(p)
        return f'<{base_url}{request.path}?{urlencode(q)}>; rel="{rel}"'

    links = []
    if page < last:
        links += [link(page + 1, "next"), link(last, "last")]
    if page > 1:
        links += [link(1, "first"), link(min(page - 1, last), "prev")]
    headers = {"X-Total-Count": str(total),
               "Access-Control-Expose-Headers": "X-Total-Count, Link"}
    if links:
        headers["Link"] = ",".join(links)
    return chunk, headers


def issue_of(ctx: Ctx, repo: Repo) -> Issue:
    try:
        number = int(ctx.request.match_info["index"])
    except ValueError as exc:
        raise ApiError(404, "Not Found") from exc
    issue = repo.issues.get(number)
    if issue is None:
        raise ApiError(404, "Not Found")
    return issue


def int_list(raw: Any, field: str) -> list[int]:
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(x, int) and not isinstance(x, bool)
                                            for x in raw):
        raise invalid("CreateIssueOption", field)
    return list(raw)


class Routes:
    """Registers Gitea routes under /api/v1; the template (for the request log and faults) is
    the full path, e.g. "POST /api/v1/repos/{owner}/{repo}/issues"."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.templates: dict[Any, str] = app[TEMPLATES_KEY]

    def add(self, method: str, path: str, handler: Handler) -> None:
        full = API + path
        route = self.app.router.add_route(
            method, full.replace("{filepath}", "{filepath:.+}"), handler)
        self.templates[route] = f"{method} {full}"
