"""Contents, repository dispatch, issue search and the rate-limit status."""

from __future__ import annotations

import re
import shlex
from typing import Any

from aiohttp import web

from ..access import visible
from ..clock import parse_iso
from ..state import Issue, Repo
from .events import emit
from .http import ApiError, Ctx, Routes, int_param, invalid, json_response, not_found
from .render import Json
from .routes_pulls import tree_at

SEARCH_CAP = 1000


def media_param(request: web.Request) -> str | None:
    """The custom media type asked for in Accept (raw, html, object, ...), if any:
    application/vnd.github.raw+json, application/vnd.github.raw, application/vnd.github.v3.raw."""
    for part in request.headers.getall("Accept", []):
        for item in part.split(","):
            m = MEDIA.fullmatch(item.split(";")[0].strip().lower())
            if m:
                return m.group(1)
    return None


MEDIA = re.compile(r"application/vnd\.github(?:\.v3)?\.([a-z]+)(?:\+json)?")


async def get_content(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = ctx.repo(scope="contents")
    tree = tree_at(repo, request.query.get("ref"))  # another branch, or a commit of one
    path = request.match_info["path"].strip("/")
    if tree is not None:  # its text files only; a directory there is not listed
        found = tree.get(path)
        if found is None:
            raise not_found()
        if media_param(request) == "raw":
            return web.Response(text=found, content_type="text/plain",
                                headers={"X-GitHub-Media-Type": "github.raw; format=json"})
        return json_response(ctx.r.content_file(repo, path, found))
    raw = repo.file_bytes(path)
    media = media_param(request)
    if raw is not None:
        if media == "raw":  # the file's bytes (Octokit hands text back as a string)
            text = path in repo.files
            return web.Response(body=raw, content_type="text/plain" if text
                                else "application/octet-stream",
                                charset="utf-8" if text else None,
                                headers={"X-GitHub-Media-Type": "github.raw; format=json"})
        return json_response(ctx.r.content_file(repo, path, raw))
    prefix = path + "/"
    children: dict[str, bool] = {}
    for p in repo.paths():
        if p.startswith(prefix):
            rest = p[len(prefix):]
            head, sep, _ = rest.partition("/")
            children[prefix + head] = children.get(prefix + head, False) or bool(sep)
    if not children:
        raise not_found()
    entries = [ctx.r.content_dir_entry(repo, p, is_dir) for p, is_dir in sorted(children.items())]
    if media == "object":  # a directory as one object with its entries
        return json_response(ctx.r.content_dir_object(repo, path, entries))
    return json_response(entries)


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


def _mentions(repo: Repo, issue: Issue, login: str) -> bool:
    at = re.compile(rf"(?<![\w@/-])@{re.escape(login)}(?![\w-])", re.IGNORECASE)
    return any(at.search(t) for t in [issue.body or "", *_comments(repo, issue)])


def _comments(repo: Repo, issue: Issue) -> list[str]:
    return [c.body for cid in issue.comment_ids if (c := repo.comments.get(cid)) is not None]


def _commenters(repo: Repo, issue: Issue) -> set[str]:
    return {c.user.lower() for cid in issue.comment_ids
            if (c := repo.comments.get(cid)) is not None}


def _count(n: int, expr: str) -> bool:
    """GitHub's numeric qualifier values: 5, >5, >=5, <5, <=5, 2..8."""
    for op in (">=", "<=", ">", "<"):
        if expr.startswith(op):
            ref = int(expr[len(op):])
            return {">=": n >= ref, "<=": n <= ref, ">": n > ref, "<": n < ref}[op]
    if ".." in expr:
        lo, hi = expr.split("..", 1)
        return (lo == "*" or n >= int(lo)) and (hi == "*" or n <= int(hi))
    return n == int(expr)


def _match(repo: Repo, issue: Issue, quals: list[tuple[str, str, bool]],
           words: list[str], where: set[str]) -> bool:
    names = {lb.name.lower() for lid in issue.labels if (lb := repo.label_by_id(lid))}
    for key, value, negate in quals:
        v = value.lower()
        if key in ("is", "state"):
            if v in ("open", "closed"):
                ok = issue.state == v
            elif v == "issue":
                ok = True
            elif v in ("pr", "pull-request", "merged", "unmerged", "draft"):
                ok = False
            elif v in ("locked", "unlocked"):
                ok = issue.locked == (v == "locked")
            else:
                ok = f"{key}:{value}".lower() in _text(repo, issue, where)
        elif key == "type":
            ok = v == "issue"
        elif key == "label":
            ok = any(n in names for n in v.split(","))
        elif key == "no":
            if v == "label":
                ok = not names
            elif v == "assignee":
                ok = not issue.assignees
            elif v in ("milestone", "project", "type"):
                ok = True  # the forge has no milestones, projects or issue types
            else:
                ok = f"{key}:{value}".lower() in _text(repo, issue, where)
        elif key == "milestone":
            ok = False
        elif key == "author":
            ok = issue.user.lower() == v
        elif key == "assignee":
            ok = v in (a.lower() for a in issue.assignees)
        elif key == "mentions":
            ok = _mentions(repo, issue, v)
        elif key == "commenter":
            ok = v in _commenters(repo, issue)
        elif key == "involves":
            ok = (issue.user.lower() == v or v in (a.lower() for a in issue.assignees)
                  or _mentions(repo, issue, v) or v in _commenters(repo, issue))
        elif key == "reason":
            ok = issue.state == "closed" and (issue.state_reason or "completed") == \
                v.replace("-", "_").replace("not planned", "not_planned")
        elif key == "comments":
            ok = _count(len(issue.comment_ids), v)
        elif key in ("created", "updated", "closed"):
            ts = {"created": issue.created_at, "updated": issue.updated_at,
                  "closed": issue.closed_at}[key]
            ok = ts is not None and _compare(ts, value)
        else:  # not a qualifier GitHub knows: searched for as text, as GitHub does
            ok = f"{key}:{value}".lower() in _text(repo, issue, where)
        if ok == negate:
            return False
    text = _text(repo, issue, where)
    return all(w.lower() in text for w in words)


def _text(repo: Repo, issue: Issue, where: set[str]) -> str:
    parts = []
    if "title" in where:
        parts.append(issue.title)
    if "body" in where:
        parts.append(issue.body or "")
    if "comments" in where:
        parts.extend(_comments(repo, issue))
    return "\n".join(parts).lower()


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


SORTS = ("comments", "reactions", "reactions-+1", "reactions--1", "reactions-smile",
         "reactions-thinking_face", "reactions-heart", "reactions-tada", "interactions",
         "created", "updated")
# the sort names' reaction contents (GitHub's names differ from the reaction API's)
REACTION_SORTS = {"reactions-+1": "+1", "reactions--1": "-1", "reactions-smile": "laugh",
                  "reactions-thinking_face": "confused", "reactions-heart": "heart",
                  "reactions-tada": "hooray"}


def _sort_key(sort: str, issue: Issue) -> tuple[float, int]:
    if sort == "created":
        return (issue.created_at, issue.id)
    if sort == "updated":
        return (issue.updated_at, issue.id)
    if sort == "comments":
        return (float(len(issue.comment_ids)), issue.id)
    if sort == "reactions":
        return (float(len(issue.reactions)), issue.id)
    if sort == "interactions":
        return (float(len(issue.reactions) + len(issue.comment_ids)), issue.id)
    content = REACTION_SORTS[sort]
    return (float(sum(1 for r in issue.reactions if r.content == content)), issue.id)


async def search_issues(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    q = request.query.get("q", "")
    if not q.strip():
        raise invalid("Search", "q", "missing")
    sort = request.query.get("sort")
    if sort is not None and sort not in SORTS:
        raise invalid("Search", "sort")
    order = request.query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid("Search", "order")
    search_type = request.query.get("search_type")
    if search_type not in (None, "semantic", "hybrid"):
        raise invalid("Search", "search_type")
    if search_type is not None and ctx.principal.kind == "none":
        raise ApiError(401, "Requires authentication")
    st = ctx.forge.state
    repos = [r for r in st.repos.values() if visible(st, ctx.principal, r)]
    quals: list[tuple[str, str, bool]] = []
    words: list[str] = []
    where: set[str] = set()
    for term in _terms(q):
        negate = term.startswith("-")
        key, sep, value = term.lstrip("-").partition(":")
        key = key.lower()
        if not sep or not value:
            words.append(term)
            continue
        if key == "in":
            for part in value.lower().split(","):
                if part not in ("title", "body", "comments"):
                    raise invalid("Search", "q")
                where.add(part)
        elif key == "sort":  # sort:created-asc in the query, as on github.com
            name, way = value.lower(), "desc"
            for suffix in ("-asc", "-desc"):
                if name.endswith(suffix):
                    name, way = name[:-len(suffix)], suffix[1:]
            if name not in SORTS:
                raise invalid("Search", "q")
            sort, order = name, way
        elif key == "repo":
            target = st.repo_by_full_name(value)
            if target is None or not visible(st, ctx.principal, target):
                raise ApiError(422, "Validation Failed", [{
                    "message": "The listed users and repositories cannot be searched either "
                               "because the resources do not exist or you do not have "
                               "permission to view them.",
                    "resource": "Search", "field": "q", "code": "invalid"}])
            repos = [r for r in repos if r.id == target.id]
        elif key in ("org", "user", "owner"):
            repos = [r for r in repos if r.owner.lower() == value.lower()]
        else:
            quals.append((key, value, negate))
    where = where or {"title", "body"}
    try:
        hits = [(r, i) for r in repos for i in r.issues.values()
                if _match(r, i, quals, words, where)]
    except ValueError as exc:
        raise invalid("Search", "q") from exc
    if sort is None:  # best match: the forge has no relevance score; newest first
        hits.sort(key=lambda t: t[1].id, reverse=order != "asc")
    else:
        hits.sort(key=lambda t: _sort_key(sort, t[1]), reverse=order != "asc")
    per_page = max(1, min(100, int_param(request, "per_page", 30)))
    page = max(1, int_param(request, "page", 1))
    reachable = hits[:SEARCH_CAP]
    chunk = reachable[(page - 1) * per_page: page * per_page]
    items: list[Json] = []
    for repo, issue in chunk:
        item = ctx.r.issue(repo, issue)
        item.pop("parent_issue_url")  # not in GitHub's issue-search-result-item
        item["score"] = 1.0
        item["body"] = item["body"] or ""  # search items type body as a (non-null) string
        item.pop("closed_by", None)  # not a field of issue-search-result-item
        items.append(item)
    from .http import paginate  # local: reuse Link building over the reachable window

    _, headers = paginate(request, reachable, ctx.forge.url)
    # GitHub's key order: items before search_type (Octokit's paginate takes the first key
    # left after total_count and incomplete_results as the list)
    body: Json = {"total_count": len(hits), "incomplete_results": False, "items": items,
                  "search_type": "lexical"}
    if search_type is not None:  # the forge has no semantic index: GitHub's lexical fallback
        body["lexical_fallback_reason"] = ["service_unavailable"]
    return json_response(body, headers=headers)


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
