"""Issue fields: an organisation's typed fields and their values on its issues, as GitHub's REST
API (2026-03-10's description; the `orgs/*-issue-field*` and `issues/*-issue-field-value*`
operations of @octokit/openapi-types) shapes them.

Definitions: `GET /orgs/{org}/issue-fields` (the org's members and installations), `POST`,
`PATCH .../{issue_field_id}` and `DELETE .../{issue_field_id}` ("the authenticated user must be
an administrator for the organization": an owner's own token here, as for issue types; the
App's installation gets 403). Types `text`, `number`, `date`, `single_select`, `multi_select`;
a select field needs its options (name, colour, priority).

Values: `GET .../issues/{n}/issue-field-values`; `PUT` (replaces them all), `POST` (adds or
updates; an empty array clears them all) and `DELETE .../issue-field-values/{issue_field_id}`
(404 when the issue has no value for it): "only users with push access" (write for the App;
else 403). A value must fit its field (a string for text, a number, an ISO 8601 date, an
option's name, a list of names for multi-select; else 422), and a field must be one of the
repository's org (a user's repository has none: 422). REST issues carry `issue_field_values`.
Each change sends the `issues` webhook `field_added` (set or updated; `changes` holds the
previous value) or `field_removed`.
"""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web

from ..access import at_least
from ..state import Issue, IssueField, IssueFieldOption, IssueFieldValue, Org, Repo
from . import issueops
from .events import emit
from .http import ApiError, Ctx, Routes, forbidden, invalid, json_response, not_found, paginate
from .routes_repos import _org, _sees_members
from .routes_work import COLORS, _owner_only

DATA_TYPES = ("text", "date", "single_select", "multi_select", "number")
VISIBILITIES = ("organization_members_only", "all")
SELECTS = ("single_select", "multi_select")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


# -- definitions -------------------------------------------------------------------------------
def _admin(ctx: Ctx, org: Org) -> None:
    _owner_only(ctx, org, "issue fields")


def _field(org: Org, request: web.Request) -> IssueField:
    try:
        wanted = int(request.match_info["issue_field_id"])
    except ValueError as exc:
        raise not_found() from exc
    found = next((f for f in org.issue_fields if f.id == wanted), None)
    if found is None:
        raise not_found()
    return found


def _options(ctx: Ctx, raw: Any, old: list[IssueFieldOption]) -> list[IssueFieldOption]:
    if not isinstance(raw, list) or not raw:
        raise invalid("IssueField", "options", "missing_field")
    now = ctx.forge.clock.now()
    out: list[IssueFieldOption] = []
    for o in raw:
        if not isinstance(o, dict) or not isinstance(o.get("name"), str) \
                or not o["name"].strip():
            raise invalid("IssueField", "options")
        if o.get("color") not in COLORS:
            raise invalid("IssueField", "options")
        priority = o.get("priority")
        if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
            raise invalid("IssueField", "options")
        if any(x.name.lower() == o["name"].strip().lower() for x in out):
            raise ApiError(422, "Option names must be unique")
        kept = next((x for x in old if x.id == o.get("id")), None) if "id" in o else None
        out.append(IssueFieldOption(
            id=kept.id if kept else ctx.forge.state.next_id("issue_field_option"),
            name=o["name"].strip(), description=o.get("description"), color=o["color"],
            priority=priority, created_at=kept.created_at if kept else now, updated_at=now))
    return out


async def list_issue_fields(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    org = _org(ctx)
    if not _sees_members(ctx, org):
        raise not_found()
    return json_response([ctx.r.issue_field(f) for f in org.issue_fields])


async def create_issue_field(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    ctx.require_auth()
    org = _org(ctx)
    if not _sees_members(ctx, org):
        raise not_found()
    _admin(ctx, org)
    body = await ctx.body()
    name, data_type = body.get("name"), body.get("data_type")
    if not isinstance(name, str) or not name.strip():
        raise invalid("IssueField", "name", "missing_field")
    if data_type not in DATA_TYPES:
        raise invalid("IssueField", "data_type", "missing_field" if data_type is None
                      else "invalid")
    description, visibility = body.get("description"), body.get("visibility",
                                                                 VISIBILITIES[0])
    if description is not None and not isinstance(description, str):
        raise invalid("IssueField", "description")
    if visibility not in VISIBILITIES:
        raise invalid("IssueField", "visibility")
    if any(f.name.lower() == name.strip().lower() for f in org.issue_fields):
        raise ApiError(422, "Name has already been taken")
    options = _options(ctx, body.get("options"), []) if data_type in SELECTS else []
    now = ctx.forge.clock.now()
    f = IssueField(id=ctx.forge.state.next_id("issue_field"), name=name.strip(),
                   data_type=data_type, description=description, visibility=visibility,
                   options=options, created_at=now, updated_at=now)
    org.issue_fields.append(f)
    return json_response(ctx.r.issue_field(f), 200)


async def update_issue_field(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    ctx.require_auth()
    org = _org(ctx)
    if not _sees_members(ctx, org):
        raise not_found()
    _admin(ctx, org)
    f = _field(org, request)
    body = await ctx.body()
    if "name" in body:
        name = body["name"]
        if not isinstance(name, str) or not name.strip():
            raise invalid("IssueField", "name")
        if any(o.id != f.id and o.name.lower() == name.strip().lower()
               for o in org.issue_fields):
            raise ApiError(422, "Name has already been taken")
        f.name = name.strip()
    if "description" in body:
        if body["description"] is not None and not isinstance(body["description"], str):
            raise invalid("IssueField", "description")
        f.description = body["description"]
    if "visibility" in body:
        if body["visibility"] not in VISIBILITIES:
            raise invalid("IssueField", "visibility")
        f.visibility = body["visibility"]
    if "options" in body:
        if f.data_type not in SELECTS:
            raise invalid("IssueField", "options")
        f.options = _options(ctx, body["options"], f.options)
        kept = {o.id for o in f.options}
        for issue in _issues_of(ctx, org):  # values naming a deleted option lose it
            for v in issue.field_values:
                if v.field_id == f.id:
                    v.option_ids = [i for i in v.option_ids if i in kept]
    f.updated_at = ctx.forge.clock.now()
    return json_response(ctx.r.issue_field(f))


async def delete_issue_field(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    ctx.require_auth()
    org = _org(ctx)
    if not _sees_members(ctx, org):
        raise not_found()
    _admin(ctx, org)
    f = _field(org, request)
    org.issue_fields = [o for o in org.issue_fields if o.id != f.id]
    for issue in _issues_of(ctx, org):
        if any(v.field_id == f.id for v in issue.field_values):
            issue.field_values = [v for v in issue.field_values if v.field_id != f.id]
    return web.Response(status=204)


def _issues_of(ctx: Ctx, org: Org) -> list[Issue]:
    return [i for r in ctx.forge.state.repos.values() if r.owner.lower() == org.login.lower()
            for i in r.issues.values()]


# -- values on an issue ------------------------------------------------------------------------
def _pusher(ctx: Ctx, repo: Repo) -> None:
    """"Only users with push access to the repository can set issue field values"."""
    if not at_least(ctx.role(repo), "write"):
        raise forbidden(ctx.principal, "You must have push access to set issue field values.")


def _fields_of(ctx: Ctx, repo: Repo) -> dict[int, IssueField]:
    org = ctx.forge.state.org(repo.owner)
    return {f.id: f for f in org.issue_fields} if org is not None else {}


def _bad_value(field_id: Any, message: str) -> ApiError:
    return ApiError(422, "Validation Failed", [{
        "resource": "IssueFieldValue", "field": "value", "code": "invalid",
        "value": field_id, "message": message}])


def _parse(fields: dict[int, IssueField], raw: Any) -> list[tuple[IssueField, Any]]:
    """The request's `issue_field_values`, each checked against its field."""
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise invalid("Issue", "issue_field_values")
    out: list[tuple[IssueField, Any]] = []
    for item in raw:
        if not isinstance(item, dict) or set(item) - {"field_id", "value"} \
                or "field_id" not in item or "value" not in item:
            raise invalid("Issue", "issue_field_values")
        fid = item["field_id"]
        f = fields.get(fid) if isinstance(fid, int) and not isinstance(fid, bool) else None
        if f is None:
            raise ApiError(422, "Validation Failed", [{
                "resource": "IssueFieldValue", "field": "field_id", "code": "invalid",
                "value": fid, "message": f"Issue field {fid} is not a field of this "
                                         "repository's organization"}])
        out.append((f, _checked(f, item["value"])))
    return out


def _checked(f: IssueField, value: Any) -> Any:
    """The value in the form it is kept: text/date a string, number a float, select fields
    their options' ids."""
    if f.data_type == "text":
        if not isinstance(value, str):
            raise _bad_value(f.id, f"{f.name} takes a string")
        return value
    if f.data_type == "number":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _bad_value(f.id, f"{f.name} takes a number")
        return float(value)
    if f.data_type == "date":
        if not isinstance(value, str) or not _DATE.match(value):
            raise _bad_value(f.id, f"{f.name} takes an ISO 8601 date (YYYY-MM-DD)")
        return value
    names = value if f.data_type == "multi_select" and isinstance(value, list) else [value]
    ids: list[int] = []
    for n in names:
        o = next((o for o in f.options if isinstance(n, str)
                  and o.name.lower() == n.lower()), None)
        if o is None:
            raise _bad_value(f.id, f"{n!r} is not an option of {f.name}")
        ids.append(o.id)
    return ids


def _set(ctx: Ctx, repo: Repo, issue: Issue, f: IssueField, value: Any) -> bool:
    old = next((v for v in issue.field_values if v.field_id == f.id), None)
    before = ctx.r.issue_field_value(f, old) if old is not None else None
    if old is None:
        v = IssueFieldValue(id=ctx.forge.state.next_id("issue_field_value"), field_id=f.id)
    else:
        v = old
    if f.data_type in SELECTS:
        if old is not None and old.option_ids == value:
            return False
        v.option_ids = list(value)
    else:
        if old is not None and old.value == value:
            return False
        v.value = value
    if old is None:
        issue.field_values.append(v)
    _emit(ctx, "field_added", repo, issue, f, v, before)
    return True


def _unset(ctx: Ctx, repo: Repo, issue: Issue, f: IssueField) -> bool:
    old = next((v for v in issue.field_values if v.field_id == f.id), None)
    if old is None:
        return False
    issue.field_values = [v for v in issue.field_values if v.field_id != f.id]
    _emit(ctx, "field_removed", repo, issue, f, old, None)
    return True


def _hook_value(ctx: Ctx, f: IssueField, v: IssueFieldValue) -> dict[str, Any]:
    """A value as the `issues.field_*` webhooks carry it."""
    out: dict[str, Any] = {"id": v.id}
    chosen = [o for i in v.option_ids for o in f.options if o.id == i]
    look = [{"id": o.id, "name": o.name, "color": o.color, "description": o.description}
            for o in chosen]
    if f.data_type == "single_select":
        if chosen:
            out.update(value_id=chosen[0].id, option=look[0])
    elif f.data_type == "multi_select":
        out.update(value_ids=[o.id for o in chosen], options=look)
    else:
        out["value"] = v.value
    return out


def _emit(ctx: Ctx, action: str, repo: Repo, issue: Issue, f: IssueField, v: IssueFieldValue,
          before: dict[str, Any] | None) -> None:
    issueops.touch(ctx, repo, issue)
    body: dict[str, Any] = {"issue": ctx.r.issue(repo, issue),
                            "issue_field": {"id": f.id, "name": f.name,
                                            "field_type": f.data_type},
                            "issue_field_value": _hook_value(ctx, f, v)}
    if before is not None:
        prev = IssueFieldValue(id=v.id, field_id=f.id, value=before["value"]
                               if f.data_type not in SELECTS else None,
                               option_ids=[o["id"] for o in (
                                   before["multi_select_options"] or
                                   ([before["single_select_option"]]
                                    if before["single_select_option"] else []))])
        body["changes"] = {"issue_field_value": {"from": _hook_value(ctx, f, prev)}}
    emit(ctx.forge, "issues", action, repo, ctx.sender, body)


def parse_for(ctx: Ctx, repo: Repo, raw: Any) -> list[tuple[IssueField, Any]]:
    """`issue_field_values` of an issue's create or update body, checked (422 when one does
    not fit); none where the repository's owner is no org (GitHub drops them silently)."""
    fields = _fields_of(ctx, repo)
    return _parse(fields, raw) if fields and raw is not None else []


def apply(ctx: Ctx, repo: Repo, issue: Issue, values: list[tuple[IssueField, Any]]) -> None:
    for f, value in values:
        _set(ctx, repo, issue, f, value)


def filtered(ctx: Ctx, repo: Repo, items: list[Issue], query: str) -> list[Issue]:
    """GitHub's `issue_field_values` list filter: `name:value` pairs, comma-separated, all of
    which an issue must have (a field's name and a value as the API shows it, any case; a
    name that is no field of the org is a 422)."""
    fields = _fields_of(ctx, repo)
    names = {f.name.lower() for f in fields.values()}
    wanted: list[tuple[str, str]] = []
    for pair in query.split(","):
        name, sep, value = pair.partition(":")
        if not sep or name.strip().lower() not in names:  # no such field: 422
            raise ApiError(422, "Validation Failed", [
                {"value": query, "resource": "Issue", "field": "issue_field_values",
                 "code": "invalid"}])
        wanted.append((name.strip().lower(), value.strip().lower()))

    def shown(issue: Issue) -> dict[str, str]:
        out: dict[str, str] = {}
        for v in issue.field_values:
            f = fields.get(v.field_id)
            if f is not None:
                rendered = ctx.r.issue_field_value(f, v)["value"]
                out[f.name.lower()] = "" if rendered is None else (
                    f"{rendered:g}" if isinstance(rendered, float) else str(rendered)).lower()
        return out

    kept = []
    for issue in items:
        has = shown(issue)
        if all(has.get(n) == v for n, v in wanted):
            kept.append(issue)
    return kept


async def list_values(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = ctx.repo()
    issue = ctx.issue(repo)
    values = ctx.r.issue_field_values(repo, issue)
    page, headers = paginate(request, values, ctx.forge.url)
    return json_response(page, headers=headers)


async def _write_values(request: web.Request, replace: bool) -> web.Response:
    ctx = Ctx.of(request)
    ctx.require_auth()
    repo = ctx.repo()
    issue = ctx.issue(repo)
    _pusher(ctx, repo)
    body = await ctx.body()
    wanted = _parse(_fields_of(ctx, repo), body.get("issue_field_values"))
    if replace or not wanted:  # PUT replaces; "adding an empty array will clear all"
        keep = {f.id for f, _ in wanted}
        fields = _fields_of(ctx, repo)
        for v in list(issue.field_values):
            if v.field_id not in keep and v.field_id in fields:
                _unset(ctx, repo, issue, fields[v.field_id])
    for f, value in wanted:
        _set(ctx, repo, issue, f, value)
    return json_response(ctx.r.issue_field_values(repo, issue))


async def set_values(request: web.Request) -> web.Response:
    return await _write_values(request, replace=True)


async def add_values(request: web.Request) -> web.Response:
    return await _write_values(request, replace=False)


async def delete_value(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    ctx.require_auth()
    repo = ctx.repo()
    issue = ctx.issue(repo)
    _pusher(ctx, repo)
    try:
        fid = int(request.match_info["issue_field_id"])
    except ValueError as exc:
        raise not_found() from exc
    f = _fields_of(ctx, repo).get(fid)
    if f is None or not _unset(ctx, repo, issue, f):
        raise not_found()
    return web.Response(status=204)


def register(routes: Routes) -> None:
    routes.add("GET", "/orgs/{org}/issue-fields", list_issue_fields)
    routes.add("POST", "/orgs/{org}/issue-fields", create_issue_field)
    routes.add("PATCH", "/orgs/{org}/issue-fields/{issue_field_id}", update_issue_field)
    routes.add("DELETE", "/orgs/{org}/issue-fields/{issue_field_id}", delete_issue_field)
    values = "/repos/{owner}/{repo}/issues/{issue_number}/issue-field-values"
    routes.add("GET", values, list_values)
    routes.add("PUT", values, set_values)
    routes.add("POST", values, add_values)
    routes.add("DELETE", f"{values}/{{issue_field_id}}", delete_value)
