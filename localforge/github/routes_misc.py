"""Contents, repository dispatch, issue search and the rate-limit status."""

from __future__ import annotations

import shlex
from typing import Any

from aiohttp import web

from ..access import visible
from ..clock import parse_iso
from ..state import Issue, Repo
from .events import emit
from .http import ApiError, Ctx, Routes, int_param, invalid, json_response, not_found
from .render import Json

SEARCH_CAP = 1000


async def get_content(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = ctx.repo(scope="contents")
    path = request.match_info["path"].strip("/")
    text = repo.files.get(path)
    if text is not None:
        return json_response(ctx.r.content_file(repo, path, text))
    prefix = path + "/"
    children: dict[str, bool] = {}
    for p in repo.files:
        if p.startswith(prefix):
            rest = p[len(prefix):]
            head, sep, _ = rest.partition("/")
            children[prefix + head] = children.get(prefix + head, False) or bool(sep)
    if not children:
        raise not_found()
    return json_response([ctx.r.content_dir_entry(repo, p, is_dir)
                          for p, is_dir in sorted(children.items())])


async def dispatch(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    ctx.require_auth()
    repo = ctx.repo(scope="contents", need="write")
    body = await ctx.body()
    event_type = body.get("event_type")
    if not isinstance(event_type, str) or not event_type:
        raise invalid("Repository", "event_type", "missing_field")
    payload = body.get("client_payload") or {}
    if not isinstance(payload, dict) or len(payload) > 10:
        raise invalid("Repository", "client_payload")
    emit(ctx.forge, "repository_dispatch", event_type, repo, ctx.sender,
         {"branch": repo.default_branch, "client_payload": payload})
    return web.Response(status=204)


def _terms(q: str) -> list[str]:
    try:
        return shlex.split(q)
    except ValueError:
        return q.split()


def _match(repo: Repo, issue: Issue, quals: list[tuple[str, str, bool]],
           words: list[str]) -> bool:
    names = {lb.name.lower() for lid in issue.labels if (lb := repo.label_by_id(lid))}
    for key, value, negate in quals:
        v = value.lower()
        ok = True
        if key in ("is", "state"):
            if v in ("open", "closed"):
                ok = issue.state == v
            elif v in ("pr", "pull-request"):
                ok = False
        elif key == "type":
            ok = v == "issue"
        elif key == "label":
            ok = v in names
        elif key == "no" and v == "label":
            ok = not names
        elif key == "author":
            ok = issue.user.lower() == v
        elif key == "assignee":
            ok = v in (a.lower() for a in issue.assignees)
        elif key in ("created", "updated"):
            ts = issue.created_at if key == "created" else issue.updated_at
            ok = _compare(ts, value)
        if ok == negate:
            return False
    text = f"{issue.title}\n{issue.body or ''}".lower()
    return all(w.lower() in text for w in words)


def _compare(ts: float, expr: str) -> bool:
    for op in (">=", "<=", ">", "<"):
        if expr.startswith(op):
            ref = parse_iso(expr[len(op):])
            return {">=": ts >= ref, "<=": ts <= ref, ">": ts > ref, "<": ts < ref}[op]
    if ".." in expr:
        lo, hi = expr.split("..", 1)
        return (lo == "*" or ts >= parse_iso(lo)) and (hi == "*" or ts <= parse_iso(hi) + 86399)
    ref = parse_iso(expr)
    return ref <= ts < ref + 86400


async def search_issues(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    q = request.query.get("q", "")
    if not q.strip():
        raise invalid("Search", "q", "missing")
    st = ctx.forge.state
    repos = [r for r in st.repos.values() if visible(st, ctx.principal, r)]
    quals: list[tuple[str, str, bool]] = []
    words: list[str] = []
    for term in _terms(q):
        negate = term.startswith("-")
        key, sep, value = term.lstrip("-").partition(":")
        if not sep or key in ("in", "sort"):
            if not sep:
                words.append(term)
            continue
        if key == "repo":
            target = st.repo_by_full_name(value)
            if target is None or not visible(st, ctx.principal, target):
                raise ApiError(422, "Validation Failed", [{
                    "message": "The listed users and repositories cannot be searched either "
                               "because the resources do not exist or you do not have "
                               "permission to view them.",
                    "resource": "Search", "field": "q", "code": "invalid"}])
            repos = [r for r in repos if r.id == target.id]
        elif key in ("org", "user"):
            repos = [r for r in repos if r.owner.lower() == value.lower()]
        else:
            quals.append((key, value, negate))
    try:
        hits = [(r, i) for r in repos for i in r.issues.values() if _match(r, i, quals, words)]
    except ValueError as exc:
        raise invalid("Search", "q") from exc
    sort = request.query.get("sort")
    order = request.query.get("order", "desc")
    sort_key: dict[str, Any] = {
        "created": lambda t: (t[1].created_at, t[1].id),
        "updated": lambda t: (t[1].updated_at, t[1].id),
        "comments": lambda t: (len(t[1].comment_ids), t[1].id),
    }
    hits.sort(key=sort_key.get(sort or "", lambda t: (t[1].id,)),
              reverse=order != "asc")
    per_page = max(1, min(100, int_param(request, "per_page", 30)))
    page = max(1, int_param(request, "page", 1))
    reachable = hits[:SEARCH_CAP]
    chunk = reachable[(page - 1) * per_page: page * per_page]
    items: list[Json] = []
    for repo, issue in chunk:
        item = ctx.r.issue(repo, issue)
        item["score"] = 1.0
        item["body"] = item["body"] or ""  # search items type body as a (non-null) string
        item.pop("closed_by", None)  # not a field of issue-search-result-item
        items.append(item)
    from .http import paginate  # local: reuse Link building over the reachable window

    _, headers = paginate(request, reachable, ctx.forge.url)
    return json_response({"total_count": len(hits), "incomplete_results": False,
                          "search_type": "lexical", "items": items}, headers=headers)


async def rate_limit(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    key = ctx.principal.rate_key
    out: dict[str, Any] = {}
    for resource in ("core", "search"):
        w = ctx.forge.rates.window(key, resource)
        out[resource] = {"limit": w.limit, "used": w.used, "remaining": w.remaining,
                         "reset": int(w.reset)}
    w = ctx.forge.rates.window(key, "core")
    out["graphql"] = {"limit": w.limit, "used": 0, "remaining": w.limit, "reset": int(w.reset)}
    return json_response({"resources": out, "rate": out["core"]})


def register(routes: Routes) -> None:
    routes.add("GET", "/repos/{owner}/{repo}/contents/{path}", get_content)
    routes.add("POST", "/repos/{owner}/{repo}/dispatches", dispatch)
    routes.add("GET", "/search/issues", search_issues)
    routes.add("GET", "/rate_limit", rate_limit)
