"""Issue comments (per issue and repository-wide) and their reactions."""

from __future__ import annotations

from aiohttp import web

from ..access import at_least
from ..state import Comment, Repo
from .events import emit
from .http import (
    ApiError,
    Ctx,
    Routes,
    check_body_length,
    forbidden,
    invalid,
    json_response,
    not_found,
    paginate,
)
from .routes_issues import _since, add_reaction, list_reactions


def _comment(ctx: Ctx, repo: Repo) -> Comment:
    try:
        cid = int(ctx.request.match_info["comment_id"])
    except ValueError as exc:
        raise not_found() from exc
    c = repo.comments.get(cid)
    if c is None:
        raise not_found()
    return c


def _text(body: dict[str, object]) -> str:
    text = body.get("body")
    if not isinstance(text, str) or text == "":
        raise invalid("IssueComment", "body", "missing_field")
    check_body_length("IssueComment", text)
    return text


async def list_issue_comments(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = ctx.repo()
    issue = ctx.issue(repo)
    since = _since(request)
    items = [c for cid in issue.comment_ids if (c := repo.comments.get(cid)) is not None
             and (since is None or c.updated_at >= since)]
    page, headers = paginate(request, items, ctx.forge.url)
    return json_response([ctx.r.comment(repo, c) for c in page], headers=headers)


async def create_comment(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    ctx.require_auth()
    need = "write" if ctx.principal.kind == "installation" else "read"
    repo = ctx.repo(need=need)
    issue = ctx.issue(repo)
    text = _text(await ctx.body())
    if issue.locked and not at_least(ctx.role(repo), "write"):
        raise ApiError(403, "Unable to create comment because issue is locked.")
    now = ctx.forge.clock.now()
    c = Comment(id=ctx.forge.state.next_id("comment"), issue_number=issue.number, body=text,
                user=ctx.sender, created_at=now, updated_at=now, via_app=ctx.principal.via_app)
    repo.comments[c.id] = c
    issue.comment_ids.append(c.id)
    issue.updated_at = repo.updated_at = now
    emit(ctx.forge, "issue_comment", "created", repo, ctx.sender,
         {"issue": ctx.r.issue(repo, issue), "comment": ctx.r.comment(repo, c)})
    return json_response(ctx.r.comment(repo, c), 201,
                         {"Location": f"{ctx.r.repo_url(repo)}/issues/comments/{c.id}"})


async def list_repo_comments(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = ctx.repo()
    q = request.query
    sort = q.get("sort", "created")
    if sort not in ("created", "updated"):
        raise invalid("IssueComment", "sort")
    direction = q.get("direction", "asc")
    if direction not in ("asc", "desc"):
        raise invalid("IssueComment", "direction")
    since = _since(request)
    items = [c for c in repo.comments.values() if since is None or c.updated_at >= since]
    if sort == "updated":
        items.sort(key=lambda c: (c.updated_at, c.id), reverse=direction == "desc")
    else:
        items.sort(key=lambda c: (c.created_at, c.id), reverse=direction == "desc")
    page, headers = paginate(request, items, ctx.forge.url)
    return json_response([ctx.r.comment(repo, c) for c in page], headers=headers)


async def get_comment(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = ctx.repo()
    return json_response(ctx.r.comment(repo, _comment(ctx, repo)))


def _may_edit(ctx: Ctx, repo: Repo, c: Comment) -> None:
    if c.user.lower() == ctx.sender.lower():
        return
    if not at_least(ctx.role(repo), "write"):
        raise forbidden(ctx.principal, "Must have admin rights to Repository.")


async def update_comment(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    ctx.require_auth()
    repo = ctx.repo()
    c = _comment(ctx, repo)
    _may_edit(ctx, repo, c)
    text = _text(await ctx.body())
    old = c.body
    c.body = text
    c.updated_at = ctx.forge.clock.now()
    issue = repo.issues[c.issue_number]
    emit(ctx.forge, "issue_comment", "edited", repo, ctx.sender,
         {"changes": {"body": {"from": old}}, "issue": ctx.r.issue(repo, issue),
          "comment": ctx.r.comment(repo, c)})
    return json_response(ctx.r.comment(repo, c))


async def delete_comment(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    ctx.require_auth()
    repo = ctx.repo()
    c = _comment(ctx, repo)
    _may_edit(ctx, repo, c)
    rendered = ctx.r.comment(repo, c)
    del repo.comments[c.id]
    issue = repo.issues[c.issue_number]
    issue.comment_ids.remove(c.id)
    emit(ctx.forge, "issue_comment", "deleted", repo, ctx.sender,
         {"issue": ctx.r.issue(repo, issue), "comment": rendered})
    return web.Response(status=204)


async def comment_reactions(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = ctx.repo()
    return list_reactions(ctx, _comment(ctx, repo).reactions)


async def create_comment_reaction(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    ctx.require_auth()
    repo = ctx.repo()
    return await add_reaction(ctx, repo, _comment(ctx, repo).reactions)


def register(routes: Routes) -> None:
    base = "/repos/{owner}/{repo}/issues"
    routes.add("GET", f"{base}/comments", list_repo_comments)
    routes.add("GET", f"{base}/comments/{{comment_id}}", get_comment)
    routes.add("PATCH", f"{base}/comments/{{comment_id}}", update_comment)
    routes.add("DELETE", f"{base}/comments/{{comment_id}}", delete_comment)
    routes.add("GET", f"{base}/comments/{{comment_id}}/reactions", comment_reactions)
    routes.add("POST", f"{base}/comments/{{comment_id}}/reactions", create_comment_reaction)
    routes.add("GET", f"{base}/{{issue_number}}/comments", list_issue_comments)
    routes.add("POST", f"{base}/{{issue_number}}/comments", create_comment)
