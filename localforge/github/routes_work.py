"""How GitHub models work beyond labels: an organisation's issue types and sub-issues.

Issue types: `GET/POST /orgs/{org}/issue-types` (creating one needs an owner of the org, as on
GitHub: "the authenticated user must be an administrator for the organization"); an issue's
`type` is set by name on create (by someone with push access: "the type is silently dropped
otherwise") and on update (`null` removes it), and GitHub's `issues` webhooks `typed` and
`untyped` follow. Sub-issues: list, add (`replace_parent` to move one), remove, reprioritise
and the parent, with GitHub's limits (100 sub-issues a parent, 8 levels) and the `sub_issues`
webhooks: `sub_issue_added` / `sub_issue_removed` to the parent's repository,
`parent_issue_added` / `parent_issue_removed` to the sub-issue's. Dependencies ("blocked by" /
"blocking"): list either side, add and remove a blocker, with GitHub's limit (50 issues on each
side of an issue) and the `issue_dependencies` webhooks: `blocked_by_added` /
`blocked_by_removed` to the blocked issue's repository, `blocking_added` / `blocking_removed`
to the blocker's.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..access import at_least, visible
from ..state import Issue, IssueType, Org, Repo
from . import issueops
from .events import emit
from .http import ApiError, Ctx, Routes, forbidden, invalid, json_response, not_found, paginate
from .routes_repos import _org, _sees_members

MAX_SUB_ISSUES = 100  # "up to 100 sub-issues per parent issue"
MAX_LEVELS = 8  # "up to eight levels of nested sub-issues"
MAX_DEPENDENCIES = 50  # issues an issue can be blocked by, and can block
COLORS = ("gray", "blue", "green", "yellow", "orange", "red", "pink", "purple")


# -- issue types -------------------------------------------------------------------------------


def _owner_only(ctx: Ctx, org: Org, what: str) -> None:
    """An org's issue types and fields are managed by its owners' own tokens alone."""
    p = ctx.principal
    if not (p.kind == "user" and p.login and not p.user_via_app
            and p.login.lower() in (o.lower() for o in org.owners)):
        raise forbidden(p, f"You must be an organization owner to manage {what}.")


async def list_issue_types(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    org = _org(ctx)
    if not _sees_members(ctx, org):
        raise not_found()
    return json_response([ctx.r.issue_type(t) for t in org.issue_types])


async def create_issue_type(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    ctx.require_auth()
    org = _org(ctx)
    if not _sees_members(ctx, org):
        raise not_found()
    _owner_only(ctx, org, "issue types")
    body = await ctx.body()
    name, enabled = body.get("name"), body.get("is_enabled")
    if not isinstance(name, str) or not name.strip():
        raise ApiError(422, "Validation Failed", [{"resource": "IssueType", "field": "name",
                                                   "code": "missing_field"}])
    if not isinstance(enabled, bool):
        raise ApiError(422, "Validation Failed", [{"resource": "IssueType",
                                                   "field": "is_enabled",
                                                   "code": "missing_field"}])
    description, color = body.get("description"), body.get("color")
    if description is not None and not isinstance(description, str):
        raise invalid("IssueType", "description")
    if color is not None and color not in COLORS:
        raise invalid("IssueType", "color")
    if any(t.name.lower() == name.strip().lower() for t in org.issue_types):
        raise ApiError(422, "Name has already been taken")
    now = ctx.forge.clock.now()
    t = IssueType(id=ctx.forge.state.next_id("issue_type"), name=name.strip(),
                  description=description, color=color, is_enabled=enabled, created_at=now,
                  updated_at=now)
    org.issue_types.append(t)
    return json_response(ctx.r.issue_type(t), 200)


def type_named(ctx: Ctx, repo: Repo, name: Any) -> IssueType:
    """The enabled issue type of the repository's org called `name` (any case), else 422."""
    org = ctx.forge.state.org(repo.owner)
    found = next((t for t in org.issue_types if isinstance(name, str) and t.is_enabled
                  and t.name.lower() == name.lower()), None) if org is not None else None
    if found is None:
        raise ApiError(422, "Validation Failed", [
            {"value": name, "resource": "Issue", "field": "type", "code": "invalid"}])
    return found


def set_type(ctx: Ctx, repo: Repo, issue: Issue, name: str | None) -> None:
    """Give `issue` the type called `name` (None: no type), with GitHub's `typed` /
    `untyped` webhook carrying the type added or removed."""
    org = ctx.forge.state.org(repo.owner)
    old = next((t for t in org.issue_types if t.id == issue.type_id), None) \
        if org is not None and issue.type_id is not None else None
    new = type_named(ctx, repo, name) if name is not None else None
    if (old.id if old else None) == (new.id if new else None):
        return
    issue.type_id = new.id if new else None
    issueops.touch(ctx, repo, issue)
    rendered = ctx.r.issue(repo, issue)
    if new is None:
        assert old is not None
        emit(ctx.forge, "issues", "untyped", repo, ctx.sender,
             {"issue": rendered, "type": ctx.r.issue_type(old)})
    else:
        emit(ctx.forge, "issues", "typed", repo, ctx.sender,
             {"issue": rendered, "type": ctx.r.issue_type(new)})


# -- sub-issues --------------------------------------------------------------------------------
def _writer(ctx: Ctx, repo: Repo) -> None:
    """Changing sub-issues is an issue write: triage for people, write for the App."""
    role = ctx.role(repo)
    ok = at_least(role, "triage") if ctx.principal.kind == "user" else at_least(role, "write")
    if not ok:
        raise forbidden(ctx.principal)


def _sub_issue_id(body: dict[str, Any], field: str = "sub_issue_id") -> int:
    raw = body.get(field)
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise ApiError(422, "Validation Failed", [{"resource": "Issue", "field": field,
                                                   "code": "missing_field"}])
    return raw


def _ancestors(ctx: Ctx, issue: Issue) -> list[Issue]:
    out: list[Issue] = []
    pid = issue.parent_id
    while pid is not None and len(out) <= MAX_LEVELS:
        found = ctx.forge.state.issue_by_id(pid)
        if found is None:
            break
        out.append(found[1])
        pid = found[1].parent_id
    return out


def _height(ctx: Ctx, issue: Issue) -> int:
    """Levels in the tree under `issue`, itself included."""
    subs = [f[1] for i in issue.sub_issue_ids if (f := ctx.forge.state.issue_by_id(i))]
    return 1 + max((_height(ctx, s) for s in subs), default=0)


def _unlink(ctx: Ctx, parent_repo: Repo, parent: Issue, sub_repo: Repo, sub: Issue) -> None:
    parent.sub_issue_ids = [i for i in parent.sub_issue_ids if i != sub.id]
    sub.parent_id = None
    issueops.touch(ctx, parent_repo, parent)
    issueops.touch(ctx, sub_repo, sub)
    _emit_link(ctx, "removed", parent_repo, parent, sub_repo, sub)


def _emit_link(ctx: Ctx, how: str, parent_repo: Repo, parent: Issue, sub_repo: Repo,
               sub: Issue) -> None:
    """GitHub's two `sub_issues` events: one to each side's repository; and on each side's
    timeline the event GitHub shows there (`sub_issue_added` on the parent,
    `parent_issue_added` on the sub-issue, `..._removed` likewise)."""
    issueops.record(ctx, parent, f"sub_issue_{how}", issue_ref=sub.id)
    issueops.record(ctx, sub, f"parent_issue_{how}", issue_ref=parent.id)
    p, s = ctx.r.issue(parent_repo, parent), ctx.r.issue(sub_repo, sub)
    emit(ctx.forge, "sub_issues", f"sub_issue_{how}", parent_repo, ctx.sender, {
        "sub_issue_id": sub.id, "sub_issue": s, "sub_issue_repo": ctx.r.repo_full(sub_repo),
        "parent_issue_id": parent.id, "parent_issue": p})
    emit(ctx.forge, "sub_issues", f"parent_issue_{how}", sub_repo, ctx.sender, {
        "parent_issue_id": parent.id, "parent_issue": p,
        "parent_issue_repo": ctx.r.repo_full(parent_repo),
        "sub_issue_id": sub.id, "sub_issue": s})


def _find_sub(ctx: Ctx, parent_repo: Repo, sub_id: int) -> tuple[Repo, Issue]:
    found = ctx.forge.state.issue_by_id(sub_id)
    if found is None:
        raise not_found()
    if found[0].owner.lower() != parent_repo.owner.lower():
        raise ApiError(422, "Validation Failed", [{
            "resource": "Issue", "field": "sub_issue_id", "code": "invalid",
            "message": "The sub-issue must belong to the same repository owner as the "
                       "parent issue"}])
    return found


async def list_sub_issues(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = ctx.repo()
    parent = ctx.issue(repo)
    subs = [f for i in parent.sub_issue_ids if (f := ctx.forge.state.issue_by_id(i))]
    page, headers = paginate(request, subs, ctx.forge.url)
    return json_response([ctx.r.issue(r, i) for r, i in page], headers=headers)


async def get_parent(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = ctx.repo()
    issue = ctx.issue(repo)
    found = ctx.forge.state.issue_by_id(issue.parent_id) if issue.parent_id else None
    if found is None:
        raise not_found()
    return json_response(ctx.r.issue(*found))


async def add_sub_issue(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    ctx.require_auth()
    repo = ctx.repo()
    parent = ctx.issue(repo)
    _writer(ctx, repo)
    body = await ctx.body()
    sub_repo, sub = _find_sub(ctx, repo, _sub_issue_id(body))
    if sub.id == parent.id or sub.id in {a.id for a in _ancestors(ctx, parent)}:
        raise ApiError(422, "Validation Failed", [{
            "resource": "Issue", "field": "sub_issue_id", "code": "invalid",
            "message": "An issue cannot be a sub-issue of itself or of its own sub-issues"}])
    if sub.parent_id == parent.id:
        raise ApiError(422, "Validation Failed", [{
            "resource": "Issue", "field": "sub_issue_id", "code": "invalid",
            "message": "Issue is already a sub-issue of this issue"}])
    if sub.parent_id is not None and body.get("replace_parent") is not True:
        raise ApiError(422, "Validation Failed", [{
            "resource": "Issue", "field": "sub_issue_id", "code": "invalid",
            "message": "Sub issue may only have one parent; set replace_parent to move it"}])
    if len(parent.sub_issue_ids) >= MAX_SUB_ISSUES:
        raise ApiError(422, "Validation Failed", [{
            "resource": "Issue", "field": "sub_issue_id", "code": "invalid",
            "message": f"Parent cannot have more than {MAX_SUB_ISSUES} sub-issues"}])
    if len(_ancestors(ctx, parent)) + 1 + _height(ctx, sub) > MAX_LEVELS:
        raise ApiError(422, "Validation Failed", [{
            "resource": "Issue", "field": "sub_issue_id", "code": "invalid",
            "message": f"Sub-issues cannot be nested more than {MAX_LEVELS} levels deep"}])
    if sub.parent_id is not None:
        old = ctx.forge.state.issue_by_id(sub.parent_id)
        if old is not None:
            _unlink(ctx, old[0], old[1], sub_repo, sub)
    parent.sub_issue_ids.append(sub.id)
    sub.parent_id = parent.id
    issueops.touch(ctx, repo, parent)
    issueops.touch(ctx, sub_repo, sub)
    _emit_link(ctx, "added", repo, parent, sub_repo, sub)
    return json_response(ctx.r.issue(repo, parent), 201,
                         {"Location": f"{ctx.r.repo_url(repo)}/issues/{parent.number}"
                                      "/sub_issues"})


async def remove_sub_issue(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    ctx.require_auth()
    repo = ctx.repo()
    parent = ctx.issue(repo)
    _writer(ctx, repo)
    body = await ctx.body()
    sub_id = _sub_issue_id(body)
    if sub_id not in parent.sub_issue_ids:
        raise not_found()
    sub_repo, sub = _find_sub(ctx, repo, sub_id)
    _unlink(ctx, repo, parent, sub_repo, sub)
    return json_response(ctx.r.issue(repo, parent), 200,
                         {"Location": f"{ctx.r.repo_url(repo)}/issues/{parent.number}"
                                      "/sub_issue"})


async def reprioritize_sub_issue(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    ctx.require_auth()
    repo = ctx.repo()
    parent = ctx.issue(repo)
    _writer(ctx, repo)
    body = await ctx.body()
    sub_id = _sub_issue_id(body)
    after, before = body.get("after_id"), body.get("before_id")
    if (after is None) == (before is None):
        raise ApiError(422, "Either after_id or before_id must be specified, not both")
    anchor = after if after is not None else before
    ids = parent.sub_issue_ids
    if sub_id not in ids or anchor not in ids or anchor == sub_id:
        raise ApiError(422, "Validation Failed: the sub-issue and the one it is placed "
                            "beside must both be sub-issues of this issue")
    ids.remove(sub_id)
    at = ids.index(anchor) + (1 if after is not None else 0)
    ids.insert(at, sub_id)
    issueops.touch(ctx, repo, parent)
    return json_response(ctx.r.issue(repo, parent))


# -- dependencies ------------------------------------------------------------------------------
def _emit_dependency(ctx: Ctx, how: str, blocked_repo: Repo, blocked: Issue,
                     blocking_repo: Repo, blocking: Issue) -> None:
    """GitHub's two `issue_dependencies` events: one to each side's repository; and on each
    side's timeline the event GitHub shows there (`blocked_by_added` on the blocked issue,
    `blocking_added` on its blocker, `..._removed` likewise), each naming the other issue as
    the description's `blocked-by-added-issue-event` etc. do."""
    issueops.record(ctx, blocked, f"blocked_by_{how}", issue_ref=blocking.id)
    issueops.record(ctx, blocking, f"blocking_{how}", issue_ref=blocked.id)
    b, by = ctx.r.issue(blocked_repo, blocked), ctx.r.issue(blocking_repo, blocking)
    emit(ctx.forge, "issue_dependencies", f"blocked_by_{how}", blocked_repo, ctx.sender, {
        "blocked_issue_id": blocked.id, "blocked_issue": b,
        "blocking_issue_id": blocking.id, "blocking_issue": by,
        "blocking_issue_repo": ctx.r.repo_full(blocking_repo)})
    emit(ctx.forge, "issue_dependencies", f"blocking_{how}", blocking_repo, ctx.sender, {
        "blocked_issue_id": blocked.id, "blocked_issue": b,
        "blocked_issue_repo": ctx.r.repo_full(blocked_repo),
        "blocking_issue_id": blocking.id, "blocking_issue": by})


def _listed(ctx: Ctx, ids: list[int]) -> list[tuple[Repo, Issue]]:
    """The issues `ids` names that the caller can see (a private blocker stays unnamed)."""
    return [f for i in ids if (f := ctx.forge.state.issue_by_id(i))
            and visible(ctx.forge.state, ctx.principal, f[0])]


async def _list_dependencies(request: web.Request, side: str) -> web.Response:
    ctx = Ctx.of(request)
    repo = ctx.repo()
    issue = ctx.issue(repo)
    ids = issue.blocked_by_ids if side == "blocked_by" else issue.blocking_ids
    page, headers = paginate(request, _listed(ctx, ids), ctx.forge.url)
    return json_response([ctx.r.issue(r, i) for r, i in page], headers=headers)


async def list_blocked_by(request: web.Request) -> web.Response:
    return await _list_dependencies(request, "blocked_by")


async def list_blocking(request: web.Request) -> web.Response:
    return await _list_dependencies(request, "blocking")


def _blocker(ctx: Ctx, raw: Any, field: str = "issue_id") -> tuple[Repo, Issue]:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise ApiError(422, "Validation Failed", [{"resource": "Issue", "field": field,
                                                   "code": "missing_field"}])
    found = ctx.forge.state.issue_by_id(raw)
    if found is None or not visible(ctx.forge.state, ctx.principal, found[0]):
        raise not_found()
    return found


def _invalid_dependency(message: str) -> ApiError:
    return ApiError(422, "Validation Failed", [{"resource": "Issue", "field": "issue_id",
                                                "code": "invalid", "message": message}])


async def add_blocked_by(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    ctx.require_auth()
    repo = ctx.repo()
    issue = ctx.issue(repo)
    _writer(ctx, repo)
    blocking_repo, blocking = _blocker(ctx, (await ctx.body()).get("issue_id"))
    if blocking.id == issue.id:
        raise _invalid_dependency("An issue cannot be blocked by itself")
    if blocking.id in issue.blocked_by_ids:
        raise _invalid_dependency("Issue is already blocked by this issue")
    if len(issue.blocked_by_ids) >= MAX_DEPENDENCIES or \
            len(blocking.blocking_ids) >= MAX_DEPENDENCIES:
        raise _invalid_dependency(f"An issue can have at most {MAX_DEPENDENCIES} dependencies "
                                  "of each kind")
    issue.blocked_by_ids.append(blocking.id)
    blocking.blocking_ids.append(issue.id)
    issueops.touch(ctx, repo, issue)
    issueops.touch(ctx, blocking_repo, blocking)
    _emit_dependency(ctx, "added", repo, issue, blocking_repo, blocking)
    return json_response(ctx.r.issue(blocking_repo, blocking), 201, {
        "Location": f"{ctx.r.repo_url(repo)}/issues/{issue.number}/dependencies/blocked_by"})


async def remove_blocked_by(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    ctx.require_auth()
    repo = ctx.repo()
    issue = ctx.issue(repo)
    _writer(ctx, repo)
    try:
        blocking_id = int(request.match_info["issue_id"])
    except ValueError as exc:
        raise not_found() from exc
    if blocking_id not in issue.blocked_by_ids:
        raise not_found()
    blocking_repo, blocking = _blocker(ctx, blocking_id)
    issue.blocked_by_ids.remove(blocking.id)
    if issue.id in blocking.blocking_ids:
        blocking.blocking_ids.remove(issue.id)
    issueops.touch(ctx, repo, issue)
    issueops.touch(ctx, blocking_repo, blocking)
    _emit_dependency(ctx, "removed", repo, issue, blocking_repo, blocking)
    return json_response(ctx.r.issue(blocking_repo, blocking))


def register(routes: Routes) -> None:
    routes.add("GET", "/orgs/{org}/issue-types", list_issue_types)
    routes.add("POST", "/orgs/{org}/issue-types", create_issue_type)
    routes.add("GET", "/repos/{owner}/{repo}/issues/{issue_number}/sub_issues",
               list_sub_issues)
    routes.add("POST", "/repos/{owner}/{repo}/issues/{issue_number}/sub_issues",
               add_sub_issue)
    routes.add("DELETE", "/repos/{owner}/{repo}/issues/{issue_number}/sub_issue",
               remove_sub_issue)
    routes.add("PATCH", "/repos/{owner}/{repo}/issues/{issue_number}/sub_issues/priority",
               reprioritize_sub_issue)
    routes.add("GET", "/repos/{owner}/{repo}/issues/{issue_number}/parent", get_parent)
    deps = "/repos/{owner}/{repo}/issues/{issue_number}/dependencies"
    routes.add("GET", f"{deps}/blocked_by", list_blocked_by)
    routes.add("POST", f"{deps}/blocked_by", add_blocked_by)
    routes.add("DELETE", f"{deps}/blocked_by/{{issue_id}}", remove_blocked_by)
    routes.add("GET", f"{deps}/blocking", list_blocking)
