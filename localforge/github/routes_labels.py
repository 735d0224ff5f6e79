"""Repository labels (addressed by name) and the labels on an issue."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..state import Label, Repo
from . import issueops
from .events import emit
from .http import ApiError, Ctx, Routes, invalid, json_response, not_found, paginate


def _label(ctx: Ctx, repo: Repo) -> Label:
    label = repo.label_named(ctx.request.match_info["name"])
    if label is None:
        raise not_found()
    return label


def _manage(ctx: Ctx) -> Repo:
    ctx.require_auth()
    return ctx.repo(need="write")


def _triage(ctx: Ctx) -> Repo:
    ctx.require_auth()
    need = "triage" if ctx.principal.kind == "user" else "write"
    return ctx.repo(need=need)


async def list_labels(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = ctx.repo()
    page, headers = paginate(request, repo.labels, ctx.forge.url)
    return json_response([ctx.r.label(repo, lb) for lb in page], headers=headers)


async def create_label(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = _manage(ctx)
    body = await ctx.body()
    name = body.get("name")
    if not isinstance(name, str) or not name.strip():
        raise invalid("Label", "name", "missing_field")
    if repo.label_named(name) is not None:
        raise invalid("Label", "name", "already_exists")
    description = body.get("description")
    label = Label(id=ctx.forge.state.next_id("label"), name=name,
                  color=issueops.normalise_color(body.get("color"), "ededed"),
                  description=description if isinstance(description, str) else None)
    repo.labels.append(label)
    emit(ctx.forge, "label", "created", repo, ctx.sender, {"label": ctx.r.label(repo, label)})
    return json_response(ctx.r.label(repo, label), 201,
                         {"Location": ctx.r.label(repo, label)["url"]})


async def get_label(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = ctx.repo()
    return json_response(ctx.r.label(repo, _label(ctx, repo)))


async def update_label(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = _manage(ctx)
    label = _label(ctx, repo)
    body = await ctx.body()
    changes: dict[str, Any] = {}
    new_name = body.get("new_name") or body.get("name")
    if isinstance(new_name, str) and new_name and new_name != label.name:
        other = repo.label_named(new_name)
        if other is not None and other.id != label.id:
            raise invalid("Label", "name", "already_exists")
        changes["name"] = {"from": label.name}
        label.name = new_name
    if "color" in body and body["color"] is not None:
        color = issueops.normalise_color(body["color"])
        if color != label.color:
            changes["color"] = {"from": label.color}
            label.color = color
    if "description" in body and body["description"] != label.description:
        changes["description"] = {"from": label.description or ""}
        label.description = body["description"]
    if changes:
        emit(ctx.forge, "label", "edited", repo, ctx.sender,
             {"label": ctx.r.label(repo, label), "changes": changes})
    return json_response(ctx.r.label(repo, label))


async def delete_label(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = _manage(ctx)
    label = _label(ctx, repo)
    rendered = ctx.r.label(repo, label)
    repo.labels.remove(label)
    for issue in repo.issues.values():
        if label.id in issue.labels:
            issue.labels.remove(label.id)
    emit(ctx.forge, "label", "deleted", repo, ctx.sender, {"label": rendered})
    return web.Response(status=204)


def _issue_labels(ctx: Ctx, repo: Repo, labels: list[int]) -> web.Response:
    out = [ctx.r.label(repo, lb) for lid in labels if (lb := repo.label_by_id(lid)) is not None]
    return json_response(out)


async def list_issue_labels(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = ctx.repo()
    issue = ctx.issue(repo)
    labels = [lb for lid in issue.labels if (lb := repo.label_by_id(lid)) is not None]
    page, headers = paginate(request, labels, ctx.forge.url)
    return json_response([ctx.r.label(repo, lb) for lb in page], headers=headers)


async def _names(ctx: Ctx, allow_empty: bool) -> list[str]:
    try:
        raw = await ctx.request.json() if ctx.request.can_read_body else {}
    except ValueError as exc:
        raise ApiError(400, "Problems parsing JSON") from exc
    names = issueops.label_names(raw if raw is not None else [])
    if not names and not allow_empty:
        raise invalid("Label", "labels", "missing_field")
    return names


async def add_issue_labels(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = _triage(ctx)
    issue = ctx.issue(repo)
    issueops.add_labels(ctx, repo, issue, await _names(ctx, allow_empty=False))
    return _issue_labels(ctx, repo, issue.labels)


async def set_issue_labels(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = _triage(ctx)
    issue = ctx.issue(repo)
    issueops.set_labels(ctx, repo, issue, await _names(ctx, allow_empty=True))
    return _issue_labels(ctx, repo, issue.labels)


async def clear_issue_labels(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = _triage(ctx)
    issue = ctx.issue(repo)
    issueops.remove_labels(ctx, repo, issue, [lb for lid in issue.labels
                                              if (lb := repo.label_by_id(lid)) is not None])
    return web.Response(status=204)


async def remove_issue_label(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = _triage(ctx)
    issue = ctx.issue(repo)
    label = repo.label_named(request.match_info["name"])
    if label is None or label.id not in issue.labels:
        raise ApiError(404, "Label does not exist")
    issueops.remove_labels(ctx, repo, issue, [label])
    return _issue_labels(ctx, repo, issue.labels)


def register(routes: Routes) -> None:
    base = "/repos/{owner}/{repo}"
    routes.add("GET", f"{base}/labels", list_labels)
    routes.add("POST", f"{base}/labels", create_label)
    routes.add("GET", f"{base}/labels/{{name}}", get_label)
    routes.add("PATCH", f"{base}/labels/{{name}}", update_label)
    routes.add("DELETE", f"{base}/labels/{{name}}", delete_label)
    routes.add("GET", f"{base}/issues/{{issue_number}}/labels", list_issue_labels)
    routes.add("POST", f"{base}/issues/{{issue_number}}/labels", add_issue_labels)
    routes.add("PUT", f"{base}/issues/{{issue_number}}/labels", set_issue_labels)
    routes.add("DELETE", f"{base}/issues/{{issue_number}}/labels", clear_issue_labels)
    routes.add("DELETE", f"{base}/issues/{{issue_number}}/labels/{{name}}", remove_issue_label)
