"""Issues: list (GitHub's filters), create, get, update, timeline, reactions."""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web

from ..access import at_least, visible
from ..clock import parse_iso
from ..state import Issue, Reaction, Repo
from . import issueops, routes_fields, routes_work, versions
from .events import emit
from .http import (
    ApiError,
    Ctx,
    Routes,
    check_body_length,
    forbidden,
    invalid,
    json_response,
    paginate,
)
from .render import REACTIONS, REFERENCE_KEYS


def _since(request: web.Request) -> float | None:
    raw = request.query.get("since")
    if not raw:
        return None
    try:
        return parse_iso(raw)
    except ValueError as exc:
        raise invalid("Issue", "since") from exc


async def list_issues(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = ctx.repo()
    q = request.query
    state = q.get("state", "open")
    if state not in ("open", "closed", "all"):
        raise invalid("Issue", "state")
    items = list(repo.issues.values())
    if state != "all":
        items = [i for i in items if i.state == state]
    if q.get("labels"):
        wanted = [n.strip().lower() for n in q["labels"].split(",") if n.strip()]
        items = [i for i in items if all(
            any((lb := repo.label_by_id(lid)) is not None and lb.name.lower() == w
                for lid in i.labels) for w in wanted)]
    since = _since(request)
    if since is not None:
        items = [i for i in items if i.updated_at >= since]
    if q.get("creator"):
        items = [i for i in items if i.user.lower() == q["creator"].lower()]
    if q.get("mentioned"):
        items = [i for i in items if _mentions(repo, i, q["mentioned"])]
    # The forge has no milestones: the filter is applied as GitHub applies it to issues that
    # have none, and an unknown milestone is GitHub's 422.
    milestone = q.get("milestone")
    if milestone is not None and milestone != "none":
        if milestone != "*":
            raise ApiError(422, "Validation Failed", [
                {"value": milestone, "resource": "Issue", "field": "milestone",
                 "code": "invalid"}])
        items = []
    kind = q.get("type")
    if kind == "none":
        items = [i for i in items if i.type_id is None]
    elif kind == "*":
        items = [i for i in items if i.type_id is not None]
    elif kind is not None:
        org = ctx.forge.state.org(repo.owner)
        ids = {t.id for t in org.issue_types if t.name.lower() == kind.lower()} \
            if org is not None else set()
        items = [i for i in items if i.type_id in ids]
    if q.get("issue_field_values"):
        items = routes_fields.filtered(ctx, repo, items, q["issue_field_values"])
    assignee = q.get("assignee")
    if assignee == "none":
        items = [i for i in items if not i.assignees]
    elif assignee == "*":
        items = [i for i in items if i.assignees]
    elif assignee:
        items = [i for i in items if assignee.lower() in (a.lower() for a in i.assignees)]
    sort = q.get("sort", "created")
    if sort not in ("created", "updated", "comments"):
        raise invalid("Issue", "sort")
    direction = q.get("direction", "desc")
    if direction not in ("asc", "desc"):
        raise invalid("Issue", "direction")

    def key(i: Issue) -> tuple[float, int]:
        if sort == "updated":
            return (i.updated_at, i.number)
        if sort == "comments":
            return (float(len(i.comment_ids)), i.number)
        return (i.created_at, i.number)

    items.sort(key=key, reverse=direction == "desc")
    page, headers = paginate(request, items, ctx.forge.url)
    return json_response([ctx.r.issue(repo, i) for i in page], headers=headers)


def _mentions(repo: Repo, issue: Issue, login: str) -> bool:
    """GitHub's `mentioned`: @login in the issue's body or in one of its comments."""
    at = re.compile(rf"(?<![\w@/-])@{re.escape(login)}(?![\w-])", re.IGNORECASE)
    texts = [issue.body or ""] + [c.body for cid in issue.comment_ids
                                  if (c := repo.comments.get(cid)) is not None]
    return any(at.search(t) for t in texts)


async def create_issue(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    ctx.require_auth()
    need = "write" if ctx.principal.kind == "installation" else "read"
    repo = ctx.repo(need=need)
    if not repo.has_issues:
        raise ApiError(410, "Issues are disabled for this repo")
    body = await ctx.body()
    title = body.get("title")
    if title is None or (isinstance(title, str) and not title.strip()):
        raise invalid("Issue", "title", "missing_field")
    if not isinstance(title, str | int):
        raise invalid("Issue", "title")
    text = body.get("body")
    if text is not None and not isinstance(text, str):
        raise invalid("Issue", "body")
    check_body_length("Issue", text)
    pushes = at_least(ctx.role(repo), "write")
    # "Only users with push access can set the type for new issues. The type is silently
    # dropped otherwise."
    kind = routes_work.type_named(ctx, repo, body["type"]) \
        if pushes and body.get("type") is not None else None
    # "Field values are silently dropped otherwise" (no push access, or a user's repository)
    values = routes_fields.parse_for(ctx, repo, body.get("issue_field_values")) \
        if pushes else []
    now = ctx.forge.clock.now()
    issue = Issue(id=ctx.forge.state.next_id("issue"), number=repo.next_number,
                  title=str(title), body=text, user=ctx.sender, created_at=now,
                  updated_at=now, via_app=ctx.principal.via_app,
                  type_id=kind.id if kind else None)
    repo.next_number += 1
    repo.issues[issue.number] = issue
    repo.updated_at = now
    names = issueops.label_names(body.get("labels") or []) if pushes else []
    labels = [issueops.ensure_label(ctx, repo, n) for n in names]
    issue.labels = list(dict.fromkeys(lb.id for lb in labels))
    if pushes:
        raw = list(body.get("assignees") or [])
        if body.get("assignee") and ctx.version == versions.V2022:  # gone in 2026-03-10
            raw.insert(0, body["assignee"])
        accts = [a for x in raw if (a := ctx.forge.state.account(str(x))) is not None]
        issue.assignees = list(dict.fromkeys(a.login for a in accts))
    # GitHub sends `opened`, then one `labeled` per label (and `assigned` per assignee),
    # every payload showing the issue as created.
    rendered = ctx.r.issue(repo, issue)
    emit(ctx.forge, "issues", "opened", repo, ctx.sender, {"issue": rendered})
    for label in labels:
        issueops.record(ctx, issue, "labeled", label={"name": label.name, "color": label.color})
        emit(ctx.forge, "issues", "labeled", repo, ctx.sender,
             {"issue": rendered, "label": ctx.r.label(repo, label)})
    for login in issue.assignees:
        issueops.record(ctx, issue, "assigned", assignee=login)
        emit(ctx.forge, "issues", "assigned", repo, ctx.sender,
             {"issue": rendered, "assignee": ctx.r.user(login)})
    if kind is not None:
        emit(ctx.forge, "issues", "typed", repo, ctx.sender,
             {"issue": rendered, "type": ctx.r.issue_type(kind)})
    routes_fields.apply(ctx, repo, issue, values)
    return json_response(ctx.r.issue(repo, issue), 201,
                         {"Location": f"{ctx.r.repo_url(repo)}/issues/{issue.number}"})


async def get_issue(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = ctx.repo()
    return json_response(ctx.r.issue(repo, ctx.issue(repo)))


async def update_issue(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    ctx.require_auth()
    repo = ctx.repo()
    issue = ctx.issue(repo)
    body = await ctx.body()
    role = ctx.role(repo)
    triage = at_least(role, "triage") if ctx.principal.kind == "user" else at_least(role, "write")
    author = issue.user.lower() == ctx.sender.lower()
    if not (triage or author):
        raise forbidden(ctx.principal, "Must have admin rights to Repository.")
    if isinstance(body.get("body"), str):
        check_body_length("Issue", body["body"])  # before anything changes
    if triage and body.get("type") is not None:
        routes_work.type_named(ctx, repo, body["type"])  # an unknown type changes nothing
    pushes = at_least(role, "write")
    values = routes_fields.parse_for(ctx, repo, body.get("issue_field_values")) \
        if pushes and "issue_field_values" in body else []
    changes: dict[str, Any] = {}
    if "title" in body and body["title"] is not None and str(body["title"]) != issue.title:
        if not str(body["title"]).strip():
            raise invalid("Issue", "title", "missing_field")
        changes["title"] = {"from": issue.title}
        issueops.renamed(ctx, issue, issue.title, str(body["title"]))
        issue.title = str(body["title"])
    if "body" in body and body["body"] != issue.body:
        changes["body"] = {"from": issue.body or ""}
        issue.body = body["body"]
    if changes:
        issueops.touch(ctx, repo, issue)
        emit(ctx.forge, "issues", "edited", repo, ctx.sender,
             {"changes": changes, "issue": ctx.r.issue(repo, issue)})
    state = body.get("state")
    if state is not None and state not in ("open", "closed"):
        raise invalid("Issue", "state")
    reason = body.get("state_reason")
    if reason is not None and reason not in ("completed", "not_planned", "duplicate",
                                             "reopened"):
        raise invalid("Issue", "state_reason")
    if state == "closed" and issue.state == "open":
        issueops.close(ctx, repo, issue, reason)
    elif state == "open" and issue.state == "closed":
        issueops.reopen(ctx, repo, issue)
    if triage and "labels" in body and body["labels"] is not None:
        issueops.set_labels(ctx, repo, issue, issueops.label_names(body["labels"]))
    singular = "assignee" in body and ctx.version == versions.V2022  # gone in 2026-03-10
    if triage and ("assignees" in body or singular):
        raw = body.get("assignees")
        if raw is None:
            raw = [body["assignee"]] if body.get("assignee") else []
        issueops.set_assignees(ctx, repo, issue, [str(a) for a in raw])
    if triage and "type" in body:
        routes_work.set_type(ctx, repo, issue, body["type"])
    routes_fields.apply(ctx, repo, issue, values)
    return json_response(ctx.r.issue(repo, issue))


async def timeline(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = ctx.repo()
    issue = ctx.issue(repo)
    entries: list[tuple[float, int, dict[str, Any]]] = []
    for e in issue.events:
        event = ctx.r.timeline_event(repo, issue, e)
        found = ctx.forge.state.issue_by_id(e.issue_ref) if e.issue_ref is not None else None
        if found is not None and not visible(ctx.forge.state, ctx.principal, found[0]):
            # the other issue of a dependency, in a repository the reader cannot see: unnamed
            event.update({k: None for k in REFERENCE_KEYS if k in event})
        entries.append((e.created_at, e.id, event))
    for cid in issue.comment_ids:
        c = repo.comments.get(cid)
        if c is not None:
            entries.append((c.created_at, c.id, ctx.r.timeline_comment(repo, c)))
    entries.sort(key=lambda t: (t[0], t[1]))
    exclude = {e.strip() for e in request.query.get("exclude", "").split(",") if e.strip()}
    shown = [e[2] for e in entries if e[2].get("event") not in exclude]
    page, headers = paginate(request, shown, ctx.forge.url)
    return json_response(page, headers=headers)


async def add_reaction(ctx: Ctx, repo: Repo, reactions: list[Reaction]) -> web.Response:
    body = await ctx.body()
    content = body.get("content")
    if content not in REACTIONS:
        raise invalid("Reaction", "content")
    for r in reactions:
        if r.user.lower() == ctx.sender.lower() and r.content == content:
            return json_response(ctx.r.reaction(r), 200)
    r = Reaction(id=ctx.forge.state.next_id("reaction"), content=str(content), user=ctx.sender,
                 created_at=ctx.forge.clock.now(), via_app=ctx.principal.via_app)
    reactions.append(r)
    return json_response(ctx.r.reaction(r), 201)


def list_reactions(ctx: Ctx, reactions: list[Reaction]) -> web.Response:
    content = ctx.request.query.get("content")
    if content is not None and content not in REACTIONS:
        raise invalid("Reaction", "content")
    items = [r for r in reactions if content is None or r.content == content]
    page, headers = paginate(ctx.request, items, ctx.forge.url)
    return json_response([ctx.r.reaction(r) for r in page], headers=headers)


async def issue_reactions(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = ctx.repo()
    return list_reactions(ctx, ctx.issue(repo).reactions)


async def create_issue_reaction(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    ctx.require_auth()
    repo = ctx.repo()
    return await add_reaction(ctx, repo, ctx.issue(repo).reactions)


def register(routes: Routes) -> None:
    routes.add("GET", "/repos/{owner}/{repo}/issues", list_issues)
    routes.add("POST", "/repos/{owner}/{repo}/issues", create_issue)
    routes.add("GET", "/repos/{owner}/{repo}/issues/{issue_number}", get_issue)
    routes.add("PATCH", "/repos/{owner}/{repo}/issues/{issue_number}", update_issue)
    routes.add("GET", "/repos/{owner}/{repo}/issues/{issue_number}/timeline", timeline)
    routes.add("GET", "/repos/{owner}/{repo}/issues/{issue_number}/reactions", issue_reactions)
    routes.add("POST", "/repos/{owner}/{repo}/issues/{issue_number}/reactions",
               create_issue_reaction)
