"""Repositories, organisations, teams, users, collaborator permission."""

from __future__ import annotations

import re

from aiohttp import web

from ..access import user_level, visible
from ..state import Org, perm_rank
from .http import ApiError, Ctx, Routes, invalid, json_response, not_found, paginate

# GitHub's repository names: ASCII letters, digits, `.`, `-` and `_`, 100 at most
_REPO_NAME = re.compile(r"[A-Za-z0-9._-]{1,100}")

REPO_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
LEGACY = {"admin": "admin", "maintain": "write", "write": "write", "triage": "read",
          "read": "read"}


def _org(ctx: Ctx) -> Org:
    org = ctx.forge.state.org(ctx.request.match_info["org"])
    if org is None:
        raise not_found()
    return org


def _sees_members(ctx: Ctx, org: Org) -> bool:
    p = ctx.principal
    if p.kind == "user" and p.login:
        return p.login.lower() in (m.lower() for m in org.members)
    if p.kind == "installation" and p.installation is not None:
        return p.installation.account.lower() == org.login.lower()
    return False


async def get_repo(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = ctx.repo(scope="metadata")
    return json_response(ctx.r.repo_full(repo, ctx.role(repo, "metadata")))


async def update_repo(request: web.Request) -> web.Response:
    """PATCH a repository: `archived` (true: read-only, every write answers 403; false: back
    to writable), `description`, and `name` (renamed: its old name leads to it, and the Apps
    on it hear `repository.renamed`; a name the owner has already is 422); an admin's (the
    App's `administration: write`)."""
    ctx = Ctx.of(request)
    ctx.require_auth()
    repo = ctx.repo(scope="administration", need="admin" if ctx.principal.kind == "user"
                    else "write", archived_ok=True)
    body = await ctx.body()
    if "name" in body:
        name = body["name"]
        if not isinstance(name, str) or not _REPO_NAME.fullmatch(name):
            raise invalid("Repository", "name")
        if name != repo.name:
            if ctx.forge.state.repo(repo.owner, name) is not None:
                raise invalid("Repository", "name", "custom",
                              "name already exists on this account")
            ctx.forge.rename_repo(repo.full_name, name, sender=ctx.sender)
    if "archived" in body:
        if not isinstance(body["archived"], bool):
            raise invalid("Repository", "archived")
        repo.archived = body["archived"]
    if "description" in body:
        if body["description"] is not None and not isinstance(body["description"], str):
            raise invalid("Repository", "description")
        repo.description = body["description"]
    repo.updated_at = ctx.forge.clock.now()
    return json_response(ctx.r.repo_full(repo, ctx.role(repo, "metadata")))


async def list_org_repos(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    org = _org(ctx)
    st = ctx.forge.state
    kind = request.query.get("type", "all")
    if kind not in ("all", "public", "private", "forks", "sources", "member"):
        raise invalid("Repository", "type")
    repos = [r for r in st.repos.values() if r.owner.lower() == org.login.lower()
             and visible(st, ctx.principal, r)]
    if kind == "public":
        repos = [r for r in repos if not r.private]
    elif kind == "private":
        repos = [r for r in repos if r.private]
    elif kind == "forks":
        repos = []  # the forge has no forks; "sources" (not forks) is then every repository
    elif kind == "member":  # those the caller reaches as a collaborator or through a team
        p = ctx.principal
        repos = [r for r in repos if p.kind == "user" and p.login is not None and (
            p.login.lower() in r.collaborators or any(
                r.id in t.repo_permissions and p.login.lower() in (m.lower() for m in t.members)
                for t in st.teams if t.org.lower() == org.login.lower()))]
    sort = request.query.get("sort", "created")
    if sort not in ("created", "updated", "pushed", "full_name"):
        raise invalid("Repository", "sort")
    direction = request.query.get("direction", "asc" if sort == "full_name" else "desc")
    if direction not in ("asc", "desc"):
        raise invalid("Repository", "direction")
    if sort == "full_name":
        repos.sort(key=lambda r: r.name.lower(), reverse=direction == "desc")
    else:
        attr = {"created": "created_at", "updated": "updated_at", "pushed": "pushed_at"}.get(
            sort, "created_at")
        repos.sort(key=lambda r: (getattr(r, attr), r.id), reverse=direction == "desc")
    page, headers = paginate(request, repos, ctx.forge.url)
    return json_response([ctx.r.repo_minimal(r, ctx.role(r, "metadata")) for r in page],
                         headers=headers)


async def create_org_repo(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    ctx.require_auth()
    org = _org(ctx)
    p = ctx.principal
    allowed = (
        (p.kind == "user" and p.login is not None
         and p.login.lower() in (m.lower() for m in org.members))
        or (p.kind == "installation" and p.installation is not None and p.app is not None
            and p.installation.account.lower() == org.login.lower()
            and p.app.permissions.get("administration") == "write")
    )
    if not allowed:
        if p.kind == "installation":
            raise ApiError(403, "Resource not accessible by integration")
        raise not_found()
    body = await ctx.body()
    name = body.get("name")
    if not isinstance(name, str) or not REPO_NAME.match(name):
        raise invalid("Repository", "name", "missing_field" if not name else "invalid",
                      "Repository creation failed.")
    if ctx.forge.state.repo(org.login, name) is not None:
        raise ApiError(422, "Repository creation failed.", [{
            "resource": "Repository", "code": "custom", "field": "name",
            "message": "name already exists on this account"}])
    private = bool(body.get("private", False)) or body.get("visibility") in ("private",
                                                                             "internal")
    desc = body.get("description")
    repo_id = ctx.forge.add_repo(org.login, name, private=private,
                                 description=desc if isinstance(desc, str) else None,
                                 sender=ctx.sender)
    repo = ctx.forge.state.repos[repo_id]
    if body.get("has_issues") is False:
        repo.has_issues = False
    return json_response(ctx.r.repo_full(repo, ctx.role(repo, "metadata") or "admin"), 201,
                         {"Location": ctx.r.repo_url(repo)})


async def collaborator_permission(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = ctx.repo(scope="metadata")
    acct = ctx.forge.state.account(request.match_info["username"])
    if acct is None or acct.type == "Organization":
        raise not_found()
    if acct.type == "Bot":
        app = ctx.forge.state.app_by_bot(acct.login)
        role = None
        if app is not None:
            inst = next((i for i in ctx.forge.state.installations_for_repo(repo)
                         if i.app_id == app.id), None)
            if inst is not None:
                role = "write" if "write" in app.permissions.values() else "read"
    else:
        role = user_level(ctx.forge.state, acct.login, repo)
    user = ctx.r.user_req(acct)
    user["role_name"] = role or "none"
    user["permissions"] = {k: v for k, v in {
        "admin": perm_rank(role) >= 5, "maintain": perm_rank(role) >= 4,
        "push": perm_rank(role) >= 3, "triage": perm_rank(role) >= 2,
        "pull": perm_rank(role) >= 1}.items()}
    return json_response({"permission": LEGACY.get(role or "", "none"),
                          "role_name": role or "none", "user": user})


async def org_members(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    org = _org(ctx)
    role = request.query.get("role", "all")
    if role not in ("all", "admin", "member"):
        raise invalid("Membership", "role")
    two_factor = request.query.get("filter", "all")
    if two_factor not in ("all", "2fa_disabled", "2fa_insecure"):
        raise invalid("Membership", "filter")
    members = list(org.members) if _sees_members(ctx, org) else []
    if two_factor != "all":
        members = []  # every account on the forge counts as having secure 2FA
    owners = {o.lower() for o in org.owners}
    if role == "admin":
        members = [m for m in members if m.lower() in owners]
    elif role == "member":
        members = [m for m in members if m.lower() not in owners]
    accts = sorted((a for m in members if (a := ctx.forge.state.account(m)) is not None),
                   key=lambda a: a.id)
    page, headers = paginate(request, accts, ctx.forge.url)
    return json_response([ctx.r.user_req(a) for a in page], headers=headers)


async def team_members(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    org = _org(ctx)
    team = ctx.forge.state.team(org.login, request.match_info["team_slug"])
    if team is None or not _sees_members(ctx, org):
        raise not_found()
    role = request.query.get("role", "all")
    if role not in ("all", "member", "maintainer"):
        raise invalid("Team", "role")
    # the forge's teams have members only, no maintainers
    accts = [] if role == "maintainer" else [
        a for m in team.members if (a := ctx.forge.state.account(m)) is not None]
    page, headers = paginate(request, accts, ctx.forge.url)
    return json_response([ctx.r.user_req(a) for a in page], headers=headers)


async def get_user(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    acct = ctx.forge.state.account(request.match_info["username"])
    if acct is None:
        raise not_found()
    return json_response(ctx.r.public_user(acct))


def register(routes: Routes) -> None:
    routes.add("GET", "/repos/{owner}/{repo}", get_repo)
    routes.add("PATCH", "/repos/{owner}/{repo}", update_repo)
    routes.add("GET", "/repos/{owner}/{repo}/collaborators/{username}/permission",
               collaborator_permission)
    routes.add("GET", "/orgs/{org}/repos", list_org_repos)
    routes.add("POST", "/orgs/{org}/repos", create_org_repo)
    routes.add("GET", "/orgs/{org}/members", org_members)
    routes.add("GET", "/orgs/{org}/teams/{team_slug}/members", team_members)
    routes.add("GET", "/users/{username}", get_user)

