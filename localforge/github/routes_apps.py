"""GitHub App routes: /app, installations, installation tokens, hook deliveries."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from ..access import installation_permissions
from ..clock import iso, parse_iso
from ..state import App
from .http import ApiError, Ctx, Routes, int_param, invalid, json_response, not_found, paginate

REDELIVERY_WINDOW = 3 * 86400  # github.com keeps deliveries redeliverable for 3 days


def _app(ctx: Ctx) -> App:
    if ctx.principal.kind != "app" or ctx.principal.app is None:
        raise ApiError(401, "A JSON web token could not be decoded")
    return ctx.principal.app


async def get_app(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    return json_response(ctx.r.integration(_app(ctx)))


async def list_installations(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    app = _app(ctx)
    insts = sorted((i for i in ctx.forge.state.installations.values() if i.app_id == app.id),
                   key=lambda i: i.id)
    raw_since = request.query.get("since")
    if raw_since:
        try:
            since = parse_iso(raw_since)
        except ValueError as exc:
            raise invalid("Installation", "since") from exc
        insts = [i for i in insts if i.updated_at >= since]
    outdated = request.query.get("outdated")
    if outdated not in (None, "", "false", "true"):
        raise invalid("Installation", "outdated")
    if outdated == "true":
        insts = []  # an installation is outdated when it has not accepted the App's newer
        # permissions; the forge's installations always hold the App's permissions
    page, headers = paginate(request, insts, ctx.forge.url)
    return json_response([ctx.r.installation(i, describe_account=True) for i in page],
                         headers=headers)


async def create_token(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    app = _app(ctx)
    try:
        inst = ctx.forge.state.installations.get(int(request.match_info["installation_id"]))
    except ValueError:
        inst = None
    if inst is None or inst.app_id != app.id:
        raise not_found()
    if inst.suspended_at is not None:
        raise ApiError(403, "This installation has been suspended")
    body = await ctx.body()
    repos = ctx.forge.state.installation_repos(inst)
    narrowed: list[int] | None = None
    if body.get("repositories") or body.get("repository_ids"):
        by_name = {r.name.lower(): r for r in repos}
        by_id = {r.id: r for r in repos}
        names = [str(n).lower() for n in body.get("repositories") or []]
        ids = [int(i) for i in body.get("repository_ids") or []]
        if any(n not in by_name for n in names) or any(i not in by_id for i in ids):
            raise invalid("Installation", "repositories",
                          message="There is at least one repository that does not exist or "
                                  "is not accessible to the parent installation.")
        narrowed = sorted({by_name[n].id for n in names} | set(ids))
    perms = dict(app.permissions)
    if isinstance(body.get("permissions"), dict):
        for key, value in body["permissions"].items():
            if key not in perms or (perms[key] == "read" and value != "read"):
                raise invalid("Installation", "permissions",
                              message="The permissions requested are not granted to this "
                                      "installation.")
            perms[key] = str(value)
    token = ctx.forge.create_installation_token(inst.id)
    token.permissions = perms if isinstance(body.get("permissions"), dict) else {}
    token.repo_ids = narrowed
    out: dict[str, Any] = {
        "token": token.token, "expires_at": iso(token.expires_at or 0),
        "permissions": perms,
        "repository_selection": "selected" if narrowed is not None
        else inst.repository_selection,
    }
    if narrowed is not None:
        out["repositories"] = [_installation_repo(ctx, r) for r in repos if r.id in narrowed]
    return json_response(out, 201)


def _installation_repo(ctx: Ctx, repo: Any, role: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = ctx.r.repo_full(repo, role)
    out.pop("organization", None)
    return out


async def installation_repositories(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    p = ctx.principal
    if p.kind != "installation" or p.installation is None:
        raise ApiError(403, "This endpoint requires you to be authenticated as an installation.")
    repos = ctx.forge.state.installation_repos(p.installation)
    if p.token is not None and p.token.repo_ids is not None:
        repos = [r for r in repos if r.id in p.token.repo_ids]
    repos.sort(key=lambda r: r.id)
    page, headers = paginate(request, repos, ctx.forge.url)
    perms = installation_permissions(p)
    role = "admin" if perms.get("administration") == "write" else (
        "write" if "write" in perms.values() else "read")
    return json_response({
        "total_count": len(repos),
        "repository_selection": p.installation.repository_selection,
        # Neither the "repository" schema nor GitHub's example has organization here
        # (tests/conformance checks for undeclared fields).
        "repositories": [_installation_repo(ctx, r, role) for r in page],
    }, headers=headers)


async def repo_installation(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    app = _app(ctx)
    st = ctx.forge.state
    mi = request.match_info
    repo = (st.repos.get(int(mi["repository_id"])) if "repository_id" in mi
            else st.repo(mi["owner"], mi["repo"]))
    if repo is None:
        raise not_found()
    inst = next((i for i in st.installations_for_repo(repo) if i.app_id == app.id), None)
    if inst is None:
        raise not_found()
    return json_response(ctx.r.installation(inst))


async def list_deliveries(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    app = _app(ctx)
    per_page = int_param(request, "per_page", 30)
    if not 1 <= per_page <= 100:
        raise invalid("Hook", "per_page")
    status = request.query.get("status")
    if status not in (None, "success", "failure"):
        raise invalid("Hook", "status")
    cursor_raw = request.query.get("cursor")
    try:
        cursor = int(cursor_raw) if cursor_raw else None
    except ValueError as exc:
        raise ApiError(400, "Invalid cursor") from exc
    items = [d for d in ctx.forge.state.deliveries.values()
             if d.app_id == app.id and d.status != "pending"]
    if status == "success":
        items = [d for d in items if 200 <= d.status_code < 400]
    elif status == "failure":
        items = [d for d in items if not 200 <= d.status_code < 400]
    items.sort(key=lambda d: d.id, reverse=True)
    if cursor is not None:
        items = [d for d in items if d.id < cursor]
    page = items[:per_page]
    headers: dict[str, str] = {}
    if len(items) > per_page:
        q = {k: v for k, v in request.query.items() if k != "cursor"}
        q["per_page"] = str(per_page)
        q["cursor"] = str(page[-1].id)
        headers["Link"] = f'<{ctx.forge.url}{request.path}?{urlencode(q)}>; rel="next"'
    return json_response([ctx.r.delivery_item(d) for d in page], headers=headers)


def _delivery_of(ctx: Ctx, app: App) -> int:
    try:
        did = int(ctx.request.match_info["delivery_id"])
    except ValueError as exc:
        raise not_found() from exc
    d = ctx.forge.state.deliveries.get(did)
    if d is None or d.app_id != app.id:
        raise not_found()
    return did


async def get_delivery(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    d = ctx.forge.state.deliveries[_delivery_of(ctx, _app(ctx))]
    return json_response(ctx.r.delivery(d))


async def redeliver(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    d = ctx.forge.state.deliveries[_delivery_of(ctx, _app(ctx))]
    if ctx.forge.clock.now() - d.delivered_at > REDELIVERY_WINDOW:
        raise invalid("Hook", "delivery_id",
                      message="This delivery is too old to be redelivered (3 days).")
    ctx.forge.webhooks.redeliver(d)
    return json_response({}, 202)


def register(routes: Routes) -> None:
    routes.add("GET", "/app", get_app)
    routes.add("GET", "/app/installations", list_installations)
    routes.add("POST", "/app/installations/{installation_id}/access_tokens", create_token)
    routes.add("GET", "/app/hook/deliveries", list_deliveries)
    routes.add("GET", "/app/hook/deliveries/{delivery_id}", get_delivery)
    routes.add("POST", "/app/hook/deliveries/{delivery_id}/attempts", redeliver)
    routes.add("GET", "/installation/repositories", installation_repositories)
    routes.add("GET", "/repos/{owner}/{repo}/installation", repo_installation)
