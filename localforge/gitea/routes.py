"""The Gitea API subset vaultmail uses (Gitea 1.22 swagger): version, users, orgs and their
hooks, repositories (by name or by id), issues, issue labels (ids or names), repository labels
by id (exclusive scoped ones among them), comments, contents, collaborator permission; issue
dependencies are in routes_deps."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from aiohttp import web

from ..access import at_least, user_level, visible
from ..clock import iso, parse_iso
from ..github.http import ApiError, Ctx, invalid
from ..state import Comment, Event, Issue, Label, Org, Repo
from . import events
from .http import Routes, int_list, issue_of, json_response, paginate, streamed_json
from .render import API, GiteaRenderer

VERSION = "1.22.6"
# webhook_service.IsValidHookTaskType (Gitea), plus Forgejo's own "forgejo"
HOOK_TYPES = ("gitea", "forgejo", "gogs", "slack", "discord", "dingtalk", "telegram",
              "msteams", "feishu", "matrix", "wechatwork", "packagist")


def _r(ctx: Ctx) -> GiteaRenderer:
    """The renderer for the caller (Gitea's ctx.Doer): what they may see of users."""
    login = ctx.principal.login if ctx.principal.kind == "user" else None
    return GiteaRenderer(ctx.forge, viewer=login)


def _auth(ctx: Ctx) -> str:
    if ctx.principal.kind != "user" or not ctx.principal.login:
        raise ApiError(401, "token is required")
    return ctx.principal.login


def _writer(ctx: Ctx, repo: Repo) -> bool:
    return at_least(ctx.role(repo), "write")


def _need_write(ctx: Ctx) -> Repo:
    _auth(ctx)
    repo = ctx.repo()
    if not _writer(ctx, repo):
        raise ApiError(403, "user should have permission to write issues")
    return repo


def _since(request: web.Request, name: str = "since") -> float | None:
    raw = request.query.get(name)
    if not raw:
        return None
    try:
        return parse_iso(raw)
    except ValueError as exc:
        raise invalid("Query", name) from exc


def _org(ctx: Ctx) -> Org:
    org = ctx.forge.state.org(ctx.request.match_info["org"])
    if org is None:
        raise ApiError(404, "Not Found")
    return org


def _touch(ctx: Ctx, repo: Repo, issue: Issue) -> None:
    issue.updated_at = repo.updated_at = ctx.forge.clock.now()


def _record(ctx: Ctx, issue: Issue, kind: str, actor: str, label: Label | None = None,
            assignee: str | None = None, rename: dict[str, str] | None = None) -> None:
    """What the issue's timeline shows (a Comment row of a type in Gitea: close, reopen,
    label, assignees, change_title): who did it, as GET .../timeline answers."""
    issue.events.append(Event(id=ctx.forge.state.next_id("event"), event=kind, actor=actor,
                              created_at=ctx.forge.clock.now(),
                              label={"id": str(label.id)} if label is not None else None,
                              assignee=assignee, rename=rename))


def _record_labels(ctx: Ctx, issue: Issue, before: list[int], actor: str) -> None:
    """models/issues.newIssueLabel / deleteIssueLabel: one label comment per label changed."""
    for gone in [i for i in before if i not in issue.labels]:
        _record(ctx, issue, "unlabeled", actor, Label(id=gone, name="", color=""))
    for added in [i for i in issue.labels if i not in before]:
        _record(ctx, issue, "labeled", actor, Label(id=added, name="", color=""))


# -- misc, users, orgs ---------------------------------------------------------------------
async def version(request: web.Request) -> web.Response:
    return json_response({"version": VERSION})


async def get_me(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    login = _auth(ctx)
    return json_response(_r(ctx).user(login))


async def my_orgs(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    login = _auth(ctx).lower()
    orgs = [o for o in ctx.forge.state.orgs.values()
            if login in (m.lower() for m in o.members)]
    page, headers = paginate(request, orgs, ctx.forge.url)
    return json_response([_r(ctx).org(o.login) for o in page], headers=headers)


async def get_user(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    acct = ctx.forge.state.account(request.match_info["username"])
    if acct is None:
        raise ApiError(404, "Not Found")
    return json_response(_r(ctx).user(acct))


async def get_org(request: web.Request) -> web.Response:
    """routers/api/v1/org/org.go Get: convert.ToOrganization (every org here is public)."""
    ctx = Ctx.of(request)
    return json_response(_r(ctx).org(_org(ctx).login))


def _member(org: Org, login: str) -> bool:
    return login.lower() in (m.lower() for m in org.members)


async def org_is_member(request: web.Request) -> web.Response:
    """routers/api/v1/org/member.go IsMember: a member or site admin asking learns 204/404;
    a user asking about themselves 404; anyone else is sent (303) to public_members."""
    ctx = Ctx.of(request)
    org = _org(ctx)
    who = ctx.forge.state.account(request.match_info["username"])
    if who is None or who.type != "User":
        raise ApiError(404, "Not Found")
    me = ctx.principal.login if ctx.principal.kind == "user" else None
    if me is not None:
        acct = ctx.forge.state.account(me)
        if _member(org, me) or (acct is not None and acct.site_admin):
            if _member(org, who.login):
                return web.Response(status=204)
            raise ApiError(404, "Not Found")
        if me.lower() == who.login.lower():
            raise ApiError(404, "Not Found")
    location = f"{API}/orgs/{quote(org.login)}/public_members/{quote(who.login)}"
    return web.Response(status=303, headers={"Location": location})


async def org_is_public_member(request: web.Request) -> web.Response:
    """IsPublicMember: memberships are private unless a member publicises theirs, and the
    forge models none ([service] DEFAULT_ORG_MEMBER_VISIBLE = false)."""
    ctx = Ctx.of(request)
    _org(ctx)
    if ctx.forge.state.account(request.match_info["username"]) is None:
        raise ApiError(404, "Not Found")
    raise ApiError(404, "Not Found")


async def org_repos(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    org = _org(ctx)
    st = ctx.forge.state
    repos = sorted((r for r in st.repos.values() if r.owner.lower() == org.login.lower()
                    and visible(st, ctx.principal, r)), key=lambda r: r.id)
    page, headers = paginate(request, repos, ctx.forge.url)
    return json_response([_r(ctx).repo(r, ctx.role(r)) for r in page], headers=headers)


def _hook_json(app: Any) -> dict[str, Any]:
    from ..clock import iso

    return {"id": app.hook_id, "type": "gitea", "branch_filter": "*",
            "config": {"url": app.webhook_url or "", "content_type": "json"},
            "events": list(app.events),  # stored expanded: Webhook.EventsArray
            "authorization_header": "", "active": app.webhook_url is not None,
            "updated_at": iso(app.created_at), "created_at": iso(app.created_at)}


def _org_owner(ctx: Ctx, org: Org) -> None:
    login = _auth(ctx).lower()
    if login not in (o.lower() for o in org.owners):
        raise ApiError(403, "Must be an organization owner")


async def create_org_hook(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    org = _org(ctx)
    _org_owner(ctx, org)
    body = await ctx.body()
    # routers/api/v1/utils/hook.go checkCreateHookOption (Forgejo also takes "forgejo")
    kind = body.get("type")
    if kind not in HOOK_TYPES:
        raise ApiError(422, f"Invalid hook type: {kind if isinstance(kind, str) else ''}")
    config = body.get("config")
    if not isinstance(config, dict) or not all(isinstance(v, str) for v in config.values()):
        raise invalid("CreateHookOption", "config")  # map[string]string
    for name in ("url", "content_type"):
        if name not in config:
            raise ApiError(422, f"Missing config option: {name}")
    if config["content_type"] not in ("json", "form"):
        raise ApiError(422, "Invalid content type")
    if not config["url"].startswith(("http://", "https://")):
        raise ApiError(422, "Invalid url")
    hook_events = body.get("events") or []
    if not isinstance(hook_events, list):
        raise invalid("CreateHookOption", "events")
    app = events.add_org_hook(ctx.forge, org.login, config["url"], config.get("secret") or None,
                              [str(e) for e in hook_events], bool(body.get("active", False)))
    return json_response(_hook_json(app), 201)


async def list_org_hooks(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    org = _org(ctx)
    _org_owner(ctx, org)
    hooks = [app for app, _ in events.org_hooks(ctx.forge, org.login)]
    page, headers = paginate(request, hooks, ctx.forge.url)
    return json_response([_hook_json(h) for h in page], headers=headers)


# -- repositories --------------------------------------------------------------------------
async def get_repo(request: web.Request) -> web.Response:
    """repo.Get, and repo.GetByID (`/repositories/{id}`): the repository under its name now,
    with the caller's permissions; 404 where it is none, or the caller may not see it."""
    ctx = Ctx.of(request)
    repo = ctx.repo()
    return json_response(_r(ctx).repo(repo, ctx.role(repo)))


async def collaborator_permission(request: web.Request) -> web.Response:
    """Gitea lets collaborators query only themselves; repo admins (and org owners) anyone."""
    ctx = Ctx.of(request)
    me = _auth(ctx)
    repo = ctx.repo()
    who = request.match_info["collaborator"]
    if who.lower() != me.lower() and not at_least(ctx.role(repo), "admin"):
        raise ApiError(403, "Only admins can query all permissions, repo admins can query all "
                            "repo permissions, collaborators can query only their own")
    acct = ctx.forge.state.account(who)
    if acct is None or acct.type == "Organization":
        raise ApiError(404, "Not Found")
    role = user_level(ctx.forge.state, acct.login, repo)
    org = ctx.forge.state.org(repo.owner)
    owner = repo.owner.lower() == acct.login.lower() or (
        org is not None and acct.login.lower() in (o.lower() for o in org.owners))
    mode = "owner" if owner else {"admin": "admin", "maintain": "write", "write": "write",
                                  "triage": "write", "read": "read"}.get(role or "", "none")
    return json_response({"permission": mode, "role_name": mode,
                          "user": _r(ctx).user(acct)})


async def get_contents(request: web.Request) -> web.StreamResponse:
    ctx = Ctx.of(request)
    repo = ctx.repo(scope="contents")
    path = request.match_info["filepath"].strip("/")
    raw = repo.file_bytes(path)  # text or not (an attachment: routes_contents)
    if raw is None:
        raise ApiError(404, "Not Found")
    return await streamed_json(request, _r(ctx).content_file(repo, path, raw), ctx.forge.streamed)


# -- issues --------------------------------------------------------------------------------
async def list_issues(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = ctx.repo()
    q = request.query
    state = q.get("state", "open")
    if state not in ("open", "closed", "all"):
        raise invalid("Issue", "state")
    items = [i for i in repo.issues.values() if state == "all" or i.state == state]
    if q.get("type") == "pulls":
        items = []
    if q.get("labels"):
        # ListIssues: GetLabelIDsInRepoByNames (names that do not exist are discarded), then
        # IncludedLabelIDs: the issue must carry every one (AND, whatever the swagger's "any"
        # says); none left is no filter at all.
        wanted = set(q["labels"].split(","))
        ids = {lb.id for lb in repo.labels if lb.name in wanted}
        if ids:
            items = [i for i in items if ids <= set(i.labels)]
    since, before = _since(request), _since(request, "before")
    if since is not None:
        items = [i for i in items if i.updated_at >= since]
    if before is not None:
        items = [i for i in items if i.updated_at <= before]
    if q.get("created_by"):
        items = [i for i in items if i.user.lower() == q["created_by"].lower()]
    items.sort(key=lambda i: (i.created_at, i.number), reverse=True)
    page, headers = paginate(request, items, ctx.forge.url)
    return json_response([_r(ctx).issue(repo, i) for i in page], headers=headers)


async def create_issue(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    login = _auth(ctx)
    repo = ctx.repo()
    if not repo.has_issues:
        raise ApiError(404, "Not Found")
    body = await ctx.body()
    title = body.get("title")
    if not isinstance(title, str) or not title.strip():
        raise ApiError(422, "[Title]: Required")
    text = body.get("body")
    if text is not None and not isinstance(text, str):
        raise invalid("CreateIssueOption", "body")
    label_ids = int_list(body.get("labels"), "labels")  # ids only: names are refused
    now = ctx.forge.clock.now()
    issue = Issue(id=ctx.forge.state.next_id("issue"), number=repo.next_number,
                  title=title, body=text or "", user=login, created_at=now, updated_at=now)
    if _writer(ctx, repo):  # labels (and assignees) from others are silently dropped
        issue.labels = list(dict.fromkeys(i for i in label_ids if repo.label_by_id(i)))
        accts = [a for x in body.get("assignees") or []
                 if (a := ctx.forge.state.account(str(x))) is not None]
        issue.assignees = list(dict.fromkeys(a.login for a in accts))
    if body.get("closed") is True:
        issue.state, issue.closed_at = "closed", now
    repo.next_number += 1
    repo.issues[issue.number] = issue
    repo.updated_at = now
    events.issue_event(ctx.forge, "opened", repo, login, issue)
    _record_labels(ctx, issue, [], login)
    if issue.labels:  # services/issue.NewIssue: IssueChangeLabels after NewIssue
        events.issue_event(ctx.forge, "label_updated", repo, login, issue)
    return json_response(_r(ctx).issue(repo, issue), 201)


async def get_issue(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = ctx.repo()
    return json_response(_r(ctx).issue(repo, issue_of(ctx, repo)))


async def edit_issue(request: web.Request) -> web.Response:
    """EditIssueOption: title, body, assignees, milestone, state, due_date, ref (no labels)."""
    ctx = Ctx.of(request)
    login = _auth(ctx)
    repo = ctx.repo()
    issue = issue_of(ctx, repo)
    writer = _writer(ctx, repo)
    if not writer and issue.user.lower() != login.lower():
        raise ApiError(403, "Forbidden")
    body = await ctx.body()
    # EditIssue: ChangeTitle (nothing when the title is the same), then ChangeContent whenever
    # `body` is given, changed or not; each sends its own `edited`, rendered at that moment.
    title = body.get("title")
    if isinstance(title, str) and title and title != issue.title:
        old = issue.title
        issue.title = title
        _touch(ctx, repo, issue)
        _record(ctx, issue, "renamed", login, rename={"from": old, "to": title})
        events.issue_event(ctx.forge, "edited", repo, login, issue, {"title": {"from": old}})
    if isinstance(body.get("body"), str):
        old = issue.body or ""
        issue.body = body["body"]
        _touch(ctx, repo, issue)
        events.issue_event(ctx.forge, "edited", repo, login, issue, {"body": {"from": old}})
    if writer and isinstance(body.get("assignees"), list):
        wanted = [a.login for x in body["assignees"]
                  if (a := ctx.forge.state.account(str(x))) is not None]
        for who in [a for a in issue.assignees if a not in wanted]:
            issue.assignees.remove(who)
            _record(ctx, issue, "unassigned", login, assignee=who)
            events.issue_event(ctx.forge, "unassigned", repo, login, issue)
        for who in [a for a in wanted if a not in issue.assignees]:
            issue.assignees.append(who)
            _record(ctx, issue, "assigned", login, assignee=who)
            events.issue_event(ctx.forge, "assigned", repo, login, issue)
    state = body.get("state")
    if state is not None and state not in ("open", "closed"):
        raise invalid("EditIssueOption", "state")
    if state == "closed" and issue.state == "open":
        issue.state, issue.closed_at = "closed", ctx.forge.clock.now()
        _touch(ctx, repo, issue)
        _record(ctx, issue, "closed", login)
        events.issue_event(ctx.forge, "closed", repo, login, issue)
    elif state == "open" and issue.state == "closed":
        issue.state, issue.closed_at = "open", None
        _touch(ctx, repo, issue)
        _record(ctx, issue, "reopened", login)
        events.issue_event(ctx.forge, "reopened", repo, login, issue)
    return json_response(_r(ctx).issue(repo, issue), 201)


# -- issue labels --------------------------------------------------------------------------
async def _label_refs(ctx: Ctx, repo: Repo) -> list[Label]:
    """IssueLabelsOption.labels: label ids, or label names (unknown ones are refused)."""
    body = await ctx.body()
    raw = body.get("labels")
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise invalid("IssueLabelsOption", "labels")
    out: list[Label] = []
    for item in raw:
        if isinstance(item, bool):
            raise invalid("IssueLabelsOption", "labels")
        label = (repo.label_by_id(item) if isinstance(item, int) else
                 repo.label_named(item) if isinstance(item, str) else None)
        if label is None:
            raise ApiError(422, f"label does not exist [id: 0, name: {item}]")
        if label not in out:
            out.append(label)
    return out


def _same_scope(repo: Repo, label_id: int, label: Label) -> bool:
    other = repo.label_by_id(label_id)
    return bool(label.exclusive_scope) and other is not None and other.id != label.id \
        and other.exclusive_scope == label.exclusive_scope


def _labels_changed(ctx: Ctx, repo: Repo, issue: Issue, before: list[int],
                    cleared: bool = False) -> None:
    """One delivery per API call, with the whole list: label_updated, or label_cleared for
    `DELETE .../labels` (IssueClearLabels). services/issue/label.go notifies after every
    AddLabels / ReplaceLabels / RemoveLabel / ClearLabels, whether or not it changed a thing."""
    if issue.labels != before:
        _touch(ctx, repo, issue)
        _record_labels(ctx, issue, before, ctx.sender)
    action = "label_cleared" if cleared else "label_updated"
    events.issue_event(ctx.forge, action, repo, ctx.sender, issue)


async def list_issue_labels(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = ctx.repo()
    return json_response(_r(ctx).issue_labels(repo, issue_of(ctx, repo)))


async def add_issue_labels(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = _need_write(ctx)
    issue = issue_of(ctx, repo)
    before = list(issue.labels)
    for label in await _label_refs(ctx, repo):
        if label.id not in issue.labels:
            # RemoveDuplicateExclusiveIssueLabels: the others of its exclusive scope go
            issue.labels = [lid for lid in issue.labels if not _same_scope(repo, lid, label)]
            issue.labels.append(label.id)
    _labels_changed(ctx, repo, issue, before)
    return json_response(_r(ctx).issue_labels(repo, issue))


async def replace_issue_labels(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = _need_write(ctx)
    issue = issue_of(ctx, repo)
    before = list(issue.labels)
    wanted = await _label_refs(ctx, repo)
    # RemoveDuplicateExclusiveLabels: of two labels of one exclusive scope, the later stays
    issue.labels = [lb.id for i, lb in enumerate(wanted) if not lb.exclusive_scope
                    or all(o.exclusive_scope != lb.exclusive_scope for o in wanted[i + 1:])]
    if set(issue.labels) == set(before):
        issue.labels = before
    _labels_changed(ctx, repo, issue, before)
    return json_response(_r(ctx).issue_labels(repo, issue))


async def clear_issue_labels(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = _need_write(ctx)
    issue = issue_of(ctx, repo)
    before = list(issue.labels)
    issue.labels = []
    _labels_changed(ctx, repo, issue, before, cleared=True)
    return web.Response(status=204)


async def delete_issue_label(request: web.Request) -> web.Response:
    """By label id; a label not on the issue is no error (204), an unknown id is 422."""
    ctx = Ctx.of(request)
    repo = _need_write(ctx)
    issue = issue_of(ctx, repo)
    try:
        label = repo.label_by_id(int(request.match_info["id"]))
    except ValueError:
        label = None
    if label is None:
        raise ApiError(422, "label does not exist")
    before = list(issue.labels)
    issue.labels = [lid for lid in issue.labels if lid != label.id]
    _labels_changed(ctx, repo, issue, before)
    return web.Response(status=204)


# -- repository labels (by id) -------------------------------------------------------------
def _label(ctx: Ctx, repo: Repo) -> Label:
    try:
        label = repo.label_by_id(int(ctx.request.match_info["id"]))
    except ValueError:
        label = None
    if label is None:
        raise ApiError(404, "Not Found")
    return label


def _color(value: Any) -> str:
    import re

    color = str(value or "").strip().removeprefix("#")
    if not re.fullmatch(r"[0-9a-fA-F]{6}", color):
        raise ApiError(422, "Color: invalid color")
    return color.lower()


async def list_labels(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = ctx.repo()
    page, headers = paginate(request, repo.labels, ctx.forge.url)
    return json_response([_r(ctx).label(repo, lb) for lb in page], headers=headers)


async def get_label(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = ctx.repo()
    return json_response(_r(ctx).label(repo, _label(ctx, repo)))


async def create_label(request: web.Request) -> web.Response:
    """Gitea allows two labels with the same name; the forge does too."""
    ctx = Ctx.of(request)
    repo = _need_write(ctx)
    body = await ctx.body()
    name = body.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ApiError(422, "[Name]: Required")
    desc = body.get("description")
    label = Label(id=ctx.forge.state.next_id("label"), name=name, color=_color(body.get("color")),
                  description=desc if isinstance(desc, str) else "",
                  exclusive=body.get("exclusive") is True)
    repo.labels.append(label)
    return json_response(_r(ctx).label(repo, label), 201)


async def edit_label(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = _need_write(ctx)
    label = _label(ctx, repo)
    body = await ctx.body()
    if isinstance(body.get("name"), str) and body["name"].strip():
        label.name = body["name"]
    if body.get("color") is not None:
        label.color = _color(body["color"])
    if isinstance(body.get("description"), str):
        label.description = body["description"]
    if isinstance(body.get("exclusive"), bool):
        label.exclusive = body["exclusive"]
    return json_response(_r(ctx).label(repo, label))


async def delete_label(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = _need_write(ctx)
    label = _label(ctx, repo)
    repo.labels.remove(label)
    for issue in repo.issues.values():
        if label.id in issue.labels:
            issue.labels.remove(label.id)
    return web.Response(status=204)


# -- comments ------------------------------------------------------------------------------
def _comment(ctx: Ctx, repo: Repo) -> Comment:
    try:
        c = repo.comments.get(int(ctx.request.match_info["id"]))
    except ValueError:
        c = None
    if c is None:
        raise ApiError(404, "Not Found")
    return c


async def list_issue_comments(request: web.Request) -> web.Response:
    """All of them: this endpoint has since/before but no paging; X-Total-Count is set."""
    ctx = Ctx.of(request)
    repo = ctx.repo()
    issue = issue_of(ctx, repo)
    since, before = _since(request), _since(request, "before")
    items = [c for cid in issue.comment_ids if (c := repo.comments.get(cid)) is not None
             and (since is None or c.updated_at >= since)
             and (before is None or c.updated_at <= before)]
    return json_response([_r(ctx).comment(repo, c) for c in items],
                         headers={"X-Total-Count": str(len(items)),
                                  "Access-Control-Expose-Headers": "X-Total-Count"})


_TIMELINE_TYPES = {"closed": "close", "reopened": "reopen", "labeled": "label",
                   "unlabeled": "label", "assigned": "assignees", "unassigned": "assignees",
                   "renamed": "change_title"}


async def issue_timeline(request: web.Request) -> web.Response:
    """ListIssueCommentsAndTimeline: the issue's comments and its events (those this forge
    records: close, reopen, label, assignees, change_title), oldest first, as
    convert.ToTimelineComment renders them (a label's `body` is "1" when it was added, ""
    when removed; an assignees' `assignee` with `removed_assignee`; a change_title's
    `old_title` and `new_title`); paged, since/before."""
    ctx = Ctx.of(request)
    repo = ctx.repo()
    issue = issue_of(ctx, repo)
    r = _r(ctx)
    since, before = _since(request), _since(request, "before")
    url = f"{r.web}/{repo.full_name}/issues/{issue.number}"
    rows: list[tuple[float, int, dict[str, Any]]] = []
    for cid in issue.comment_ids:
        if (c := repo.comments.get(cid)) is not None:
            rows.append((c.created_at, c.id, {**r.comment(repo, c), "type": "comment",
                                              "label": None, "assignee": None,
                                              "removed_assignee": False, "old_title": "",
                                              "new_title": ""}))
    for e in issue.events:
        kind = _TIMELINE_TYPES.get(e.event)
        if kind is None:
            continue
        label = repo.label_by_id(int(e.label["id"])) if e.label else None
        rows.append((e.created_at, e.id, {
            "id": e.id, "type": kind, "html_url": f"{url}#issuecomment-{e.id}",
            "pull_request_url": "", "issue_url": url, "user": r.anonymous_user(e.actor),
            "body": "1" if e.event == "labeled" else "",
            "created_at": iso(e.created_at), "updated_at": iso(e.created_at),
            "label": r.label(repo, label) if label is not None else None,
            "assignee": r.anonymous_user(e.assignee) if e.assignee else None,
            "removed_assignee": e.event == "unassigned",
            "old_title": (e.rename or {}).get("from", ""),
            "new_title": (e.rename or {}).get("to", "")}))
    items = [row for at, _, row in sorted(rows, key=lambda t: (t[0], t[1]))
             if (since is None or at >= since) and (before is None or at <= before)]
    page, headers = paginate(request, items, ctx.forge.url)
    return json_response(page, headers=headers)


async def list_repo_comments(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = ctx.repo()
    since = _since(request)
    items = sorted((c for c in repo.comments.values()
                    if since is None or c.updated_at >= since), key=lambda c: c.id)
    page, headers = paginate(request, items, ctx.forge.url)
    return json_response([_r(ctx).comment(repo, c) for c in page], headers=headers)


async def create_comment(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    login = _auth(ctx)
    repo = ctx.repo()
    issue = issue_of(ctx, repo)
    text = (await ctx.body()).get("body")
    if not isinstance(text, str) or not text:
        raise ApiError(422, "[Body]: Required")
    if issue.locked and not _writer(ctx, repo):
        raise ApiError(403, "Forbidden")
    now = ctx.forge.clock.now()
    c = Comment(id=ctx.forge.state.next_id("comment"), issue_number=issue.number, body=text,
                user=login, created_at=now, updated_at=now)
    repo.comments[c.id] = c
    issue.comment_ids.append(c.id)
    _touch(ctx, repo, issue)
    events.comment_event(ctx.forge, "created", repo, login, issue, _r(ctx).comment(repo, c))
    return json_response(_r(ctx).comment(repo, c), 201)


async def get_comment(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = ctx.repo()
    return json_response(_r(ctx).comment(repo, _comment(ctx, repo)))


def _may_edit(ctx: Ctx, repo: Repo, c: Comment) -> str:
    login = _auth(ctx)
    if c.user.lower() != login.lower() and not _writer(ctx, repo):
        raise ApiError(403, "Forbidden")
    return login


async def edit_comment(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = ctx.repo()
    c = _comment(ctx, repo)
    login = _may_edit(ctx, repo, c)
    text = (await ctx.body()).get("body")
    if not isinstance(text, str) or not text:
        raise ApiError(422, "[Body]: Required")
    old, c.body = c.body, text
    c.updated_at = ctx.forge.clock.now()
    issue = repo.issues[c.issue_number]
    events.comment_event(ctx.forge, "edited", repo, login, issue, _r(ctx).comment(repo, c),
                         {"body": {"from": old}})
    return json_response(_r(ctx).comment(repo, c))


async def delete_comment(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = ctx.repo()
    c = _comment(ctx, repo)
    login = _may_edit(ctx, repo, c)
    rendered = _r(ctx).comment(repo, c)
    del repo.comments[c.id]
    issue = repo.issues[c.issue_number]
    issue.comment_ids.remove(c.id)
    events.comment_event(ctx.forge, "deleted", repo, login, issue, rendered)
    return web.Response(status=204)


def register(routes: Routes) -> None:
    base = "/repos/{owner}/{repo}"
    routes.add("GET", "/version", version)
    routes.add("GET", "/user", get_me)
    routes.add("GET", "/user/orgs", my_orgs)
    routes.add("GET", "/users/{username}", get_user)
    routes.add("GET", "/orgs/{org}", get_org)
    routes.add("GET", "/orgs/{org}/members/{username}", org_is_member)
    routes.add("GET", "/orgs/{org}/public_members/{username}", org_is_public_member)
    routes.add("GET", "/orgs/{org}/repos", org_repos)
    routes.add("GET", "/orgs/{org}/hooks", list_org_hooks)
    routes.add("POST", "/orgs/{org}/hooks", create_org_hook)
    routes.add("GET", base, get_repo)
    routes.add("GET", "/repositories/{repository_id}", get_repo)
    routes.add("GET", f"{base}/collaborators/{{collaborator}}/permission",
               collaborator_permission)
    routes.add("GET", f"{base}/contents/{{filepath}}", get_contents)
    routes.add("GET", f"{base}/labels", list_labels)
    routes.add("POST", f"{base}/labels", create_label)
    routes.add("GET", f"{base}/labels/{{id}}", get_label)
    routes.add("PATCH", f"{base}/labels/{{id}}", edit_label)
    routes.add("DELETE", f"{base}/labels/{{id}}", delete_label)
    routes.add("GET", f"{base}/issues", list_issues)
    routes.add("POST", f"{base}/issues", create_issue)
    routes.add("GET", f"{base}/issues/comments", list_repo_comments)
    routes.add("GET", f"{base}/issues/comments/{{id}}", get_comment)
    routes.add("PATCH", f"{base}/issues/comments/{{id}}", edit_comment)
    routes.add("DELETE", f"{base}/issues/comments/{{id}}", delete_comment)
    routes.add("GET", f"{base}/issues/{{index}}", get_issue)
    routes.add("PATCH", f"{base}/issues/{{index}}", edit_issue)
    routes.add("GET", f"{base}/issues/{{index}}/labels", list_issue_labels)
    routes.add("POST", f"{base}/issues/{{index}}/labels", add_issue_labels)
    routes.add("PUT", f"{base}/issues/{{index}}/labels", replace_issue_labels)
    routes.add("DELETE", f"{base}/issues/{{index}}/labels", clear_issue_labels)
    routes.add("DELETE", f"{base}/issues/{{index}}/labels/{{id}}", delete_issue_label)
    routes.add("GET", f"{base}/issues/{{index}}/comments", list_issue_comments)
    routes.add("GET", f"{base}/issues/{{index}}/timeline", issue_timeline)
    routes.add("POST", f"{base}/issues/{{index}}/comments", create_comment)
