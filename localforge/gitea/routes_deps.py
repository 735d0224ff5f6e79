"""Gitea's issue dependencies (routers/api/v1/repo/issue_dependency.go, Gitea 1.22), on the
same state as GitHub's (`Issue.blocked_by_ids` / `blocking_ids`): an issue "depends on" the
issues that block it.

* `GET .../issues/{index}/dependencies`: the issues that block this one; `GET .../blocks`:
  those it blocks (`page`, `limit`).
* `POST` / `DELETE .../dependencies` with an `IssueMeta` body (`owner`, `repo`, `index`): make
  the issue in the path depend on (or no longer depend on) the one in the body; `POST` /
  `DELETE .../blocks`: the other way round. Each answers 201 with the issue in the path, the
  removals too (the handler says `StatusCreated` whatever its swagger says).
* The blocked issue's repository takes write access, the blocker's read; without them, 404, as
  Gitea hides what one may not touch. Cross-repository dependencies are allowed (Gitea's
  `ALLOW_CROSS_REPOSITORY_DEPENDENCIES` defaults to true).
* A dependency already there, one that would be circular (the other issue already depends on
  this one) and one that is not there to remove are errors of the model that the API handler
  answers with 500, as Gitea does.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..access import at_least, level, visible
from ..github.http import ApiError, Ctx
from ..state import Issue, Repo
from .http import Routes, issue_of, json_response, paginate
from .routes import _auth, _r, _touch


def _meta(ctx: Ctx, body: dict[str, Any]) -> tuple[Repo, Issue]:
    """The issue an `IssueMeta` body names, if the caller may see it."""
    owner, name, index = body.get("owner"), body.get("repo"), body.get("index")
    if not isinstance(index, int) or isinstance(index, bool):
        raise ApiError(422, "[Index]: Required")
    st = ctx.forge.state
    repo = st.repo(str(owner or ""), str(name or ""))
    if repo is None or not visible(st, ctx.principal, repo):
        raise ApiError(404, "Not Found")
    issue = repo.issues.get(index)
    if issue is None:
        raise ApiError(404, "Not Found")
    return repo, issue


def _may(ctx: Ctx, blocked_repo: Repo, blocker_repo: Repo) -> None:
    st = ctx.forge.state
    if not at_least(level(st, ctx.principal, blocked_repo, "issues"), "write") or \
            not at_least(level(st, ctx.principal, blocker_repo, "issues"), "read"):
        raise ApiError(404, "Not Found")


def _link(ctx: Ctx, blocked: tuple[Repo, Issue], blocker: tuple[Repo, Issue]) -> None:
    (brepo, b), (orepo, o) = blocked, blocker
    _may(ctx, brepo, orepo)
    if o.id in b.blocked_by_ids:
        raise ApiError(500, "dependency already exists")
    if b.id == o.id or b.id in o.blocked_by_ids:
        raise ApiError(500, "circular dependency")
    b.blocked_by_ids.append(o.id)
    o.blocking_ids.append(b.id)
    _touch(ctx, brepo, b)


def _unlink(ctx: Ctx, blocked: tuple[Repo, Issue], blocker: tuple[Repo, Issue]) -> None:
    (brepo, b), (orepo, o) = blocked, blocker
    _may(ctx, brepo, orepo)
    if o.id not in b.blocked_by_ids:
        raise ApiError(500, "dependency does not exist")
    b.blocked_by_ids.remove(o.id)
    if b.id in o.blocking_ids:
        o.blocking_ids.remove(b.id)
    _touch(ctx, brepo, b)


async def _list(request: web.Request, side: str) -> web.Response:
    ctx = Ctx.of(request)
    repo = ctx.repo()
    issue = issue_of(ctx, repo)
    st = ctx.forge.state
    ids = issue.blocked_by_ids if side == "dependencies" else issue.blocking_ids
    found = [f for i in ids if (f := st.issue_by_id(i)) and visible(st, ctx.principal, f[0])]
    page, headers = paginate(request, found, ctx.forge.url)
    return json_response([_r(ctx).issue(r, i) for r, i in page], headers=headers)


async def list_dependencies(request: web.Request) -> web.Response:
    return await _list(request, "dependencies")


async def list_blocks(request: web.Request) -> web.Response:
    return await _list(request, "blocks")


async def _change(request: web.Request, side: str, add: bool) -> web.Response:
    ctx = Ctx.of(request)
    _auth(ctx)
    repo = ctx.repo()
    here = (repo, issue_of(ctx, repo))
    there = _meta(ctx, await ctx.body())
    blocked, blocker = (here, there) if side == "dependencies" else (there, here)
    (_link if add else _unlink)(ctx, blocked, blocker)
    return json_response(_r(ctx).issue(*here), 201)


async def add_dependency(request: web.Request) -> web.Response:
    return await _change(request, "dependencies", True)


async def remove_dependency(request: web.Request) -> web.Response:
    return await _change(request, "dependencies", False)


async def add_block(request: web.Request) -> web.Response:
    return await _change(request, "blocks", True)


async def remove_block(request: web.Request) -> web.Response:
    return await _change(request, "blocks", False)


def register(routes: Routes) -> None:
    base = "/repos/{owner}/{repo}/issues/{index}"
    routes.add("GET", f"{base}/dependencies", list_dependencies)
    routes.add("POST", f"{base}/dependencies", add_dependency)
    routes.add("DELETE", f"{base}/dependencies", remove_dependency)
    routes.add("GET", f"{base}/blocks", list_blocks)
    routes.add("POST", f"{base}/blocks", add_block)
    routes.add("DELETE", f"{base}/blocks", remove_block)
