"""Branches, pull requests and check runs, minimal and shaped as GitHub's (the `pulls`,
`checks` and `repos/*-commit*` operations of @octokit/openapi-types and githubkit's models).

- A repository may hold branches besides its default one (`Repo.branches`): each its whole
  tree and a head commit that changes at every push (`LocalForge.push_to_branch`); a commit
  on one keeps its tree (`Repo.commits`), so contents read `?ref=<sha>` see that commit's
  files. The default branch has no history: its head sha is `Repo.head_sha`.
- Pull requests are opened from a branch to the default one by the seeding API
  (`LocalForge.open_pull`), with the `pull_request` webhooks `opened` and, at each further
  push to the branch, `synchronize` (with `before` / `after`). Read: `GET .../pulls/{n}` and
  `GET .../pulls/{n}/files` (filename, status added / modified / removed against the tree
  the branch was made from, the line counts). No forks, reviews, merging or diffs (`patch`).
- Check runs (`POST /repos/{o}/{r}/check-runs`, `PATCH` and `GET .../check-runs/{id}`,
  `GET .../check-runs/{id}/annotations`, `GET .../commits/{ref}/check-runs`): only a GitHub
  App's installation creates them (a personal token: 403 "You must authenticate via a GitHub
  App."), with `checks: write`; only the App that made one updates it. `name` and a
  `head_sha` the repository has are required (else 422 `No commit found for SHA: ...`); a
  `conclusion` completes the run; `output` needs `title` and `summary` (it and `text` at
  most 65,535 characters, else 422 "Only 65535 characters are allowed"); at most 50
  annotations a request, each with `path`, `start_line`, `end_line`, `annotation_level`
  (notice, warning, failure) and `message`, columns only on one line; an update's
  annotations are added to those the run has. The list takes `check_name`, `status`,
  `filter` (latest: the newest run of each name, the default; all) and `app_id`. No
  check_suite or check_run webhooks.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from aiohttp import web

from ..clock import iso, parse_iso
from ..state import Branch, CheckRun, Commit, PullRequest, Repo
from .events import emit
from .http import ApiError, Ctx, Routes, forbidden, int_param, invalid, json_response, paginate
from .render import Json, Renderer, blob_sha, node_id

if TYPE_CHECKING:
    from ..forge import LocalForge

STATUSES = ("queued", "in_progress", "completed")
CONCLUSIONS = ("action_required", "cancelled", "failure", "neutral", "success", "skipped",
               "stale", "timed_out")
LEVELS = ("notice", "warning", "failure")
MAX_ANNOTATIONS = 50
MAX_OUTPUT_TEXT = 65_535  # GitHub's documented limit on output.summary and output.text


# -- commits and branches (the seeding side: LocalForge.push_to_branch / open_pull) ------------
def new_sha() -> str:
    return secrets.token_hex(20)


def default_head(repo: Repo) -> str:
    """The default branch's head sha, made up once when no commit has named one yet."""
    if not repo.head_sha:
        repo.head_sha = hashlib.sha1(f"{repo.full_name}\n{repo.pushed_at}".encode()).hexdigest()
    return repo.head_sha


def push(forge: LocalForge, repo: Repo, branch: str, files: dict[str, str | None],
         author: str, message: str | None = None) -> tuple[str, str]:
    """Commit `files` (path -> text; None removes it) on `branch`, made from the default one
    when new. Returns (before, after): the head sha before and after the commit."""
    if branch == repo.default_branch:
        raise ValueError("push_to_branch is for branches besides the default one: "
                         "put_file commits to the default branch")
    now = forge.clock.now()
    b = repo.branches.get(branch)
    if b is None:
        base = default_head(repo)
        b = Branch(name=branch, files=dict(repo.files), base_files=dict(repo.files),
                   base_sha=base, head_sha=base)
        repo.branches[branch] = b
    before = b.head_sha
    tree = dict(b.files)
    for path, text in files.items():
        path = path.strip("/")
        if text is None:
            tree.pop(path, None)
        else:
            tree[path] = text
    sha = new_sha()
    repo.commits[sha] = Commit(sha=sha, branch=branch, author=author, parents=[before],
                               message=message or f"Update {', '.join(sorted(files))}",
                               files=dict(tree), created_at=now)
    b.files = tree
    b.head_sha = sha
    repo.pushed_at = repo.updated_at = now
    for pr in repo.pulls.values():
        if pr.head_ref == branch and pr.state == "open":
            pr.head_sha, pr.updated_at, pr.commits = sha, now, pr.commits + 1
            pull_request_event(forge, repo, pr, "synchronize", author,
                               {"before": before, "after": sha})
    return before, sha


def open_pull(forge: LocalForge, repo: Repo, head: str, author: str, title: str,
              body: str | None) -> PullRequest:
    b = repo.branches.get(head)
    if b is None:
        raise KeyError(f"no branch {head!r} in {repo.full_name}")
    now = forge.clock.now()
    number = repo.next_number  # pull requests and issues share their numbers
    repo.next_number = number + 1
    pr = PullRequest(id=forge.state.next_id("pull"), number=number, title=title, body=body,
                     user=author, head_ref=head, base_ref=repo.default_branch,
                     head_sha=b.head_sha, base_sha=b.base_sha, created_at=now, updated_at=now,
                     commits=sum(1 for c in repo.commits.values() if c.branch == head))
    repo.pulls[number] = pr
    pull_request_event(forge, repo, pr, "opened", author, {})
    return pr


def tree_at(repo: Repo, ref: str | None) -> dict[str, str] | None:
    """The files at `ref` when it is another branch or a commit of one; None for the default
    branch (the repository's own files); 404 when the repository has no such ref."""
    if ref in (None, ""):
        return None
    assert ref is not None
    name = ref.removeprefix("refs/").removeprefix("heads/")
    if name == repo.default_branch or (repo.head_sha and ref == repo.head_sha):
        return None
    if name in repo.branches:
        return repo.branches[name].files
    commit = repo.commits.get(ref)
    if commit is not None:
        return commit.files
    raise ApiError(404, f"No commit found for the ref {ref}")


def _sha_of(repo: Repo, ref: str) -> str | None:
    name = ref.removeprefix("refs/").removeprefix("heads/")
    if name == repo.default_branch:
        return default_head(repo)
    if name in repo.branches:
        return repo.branches[name].head_sha
    known = {repo.head_sha, *repo.commits, *(b.base_sha for b in repo.branches.values())}
    return ref if ref in known and ref else None


# -- shapes --------------------------------------------------------------------------------
def _branch_end(r: Renderer, repo: Repo, ref: str, sha: str) -> Json:
    return {"label": f"{repo.owner}:{ref}", "ref": ref, "sha": sha,
            "user": r.user_req(repo.owner), "repo": r.repo_hook(repo)}


def pull_request(r: Renderer, repo: Repo, pr: PullRequest) -> Json:
    """A pull request as GitHub's REST `pull-request` and its webhooks have it."""
    u = f"{r.repo_url(repo)}/pulls/{pr.number}"
    issue = f"{r.repo_url(repo)}/issues/{pr.number}"
    html = f"{r.web}/{repo.full_name}/pull/{pr.number}"
    statuses = f"{r.repo_url(repo)}/statuses/{pr.head_sha}"
    changed = diff(repo, pr)
    return {
        "url": u, "id": pr.id, "node_id": node_id("PullRequest", pr.id), "html_url": html,
        "diff_url": f"{html}.diff", "patch_url": f"{html}.patch", "issue_url": issue,
        "number": pr.number, "state": pr.state, "locked": False, "title": pr.title,
        "user": r.user(pr.user), "body": pr.body, "created_at": iso(pr.created_at),
        "updated_at": iso(pr.updated_at),
        "closed_at": iso(pr.closed_at) if pr.closed_at else None, "merged_at": None,
        "merge_commit_sha": None, "assignee": None, "assignees": [],
        "requested_reviewers": [], "requested_teams": [], "labels": [], "milestone": None,
        "draft": False, "commits_url": f"{u}/commits",
        "review_comments_url": f"{u}/comments",
        "review_comment_url": f"{r.repo_url(repo)}/pulls/comments{{/number}}",
        "comments_url": f"{issue}/comments", "statuses_url": statuses,
        "head": _branch_end(r, repo, pr.head_ref, pr.head_sha),
        "base": _branch_end(r, repo, pr.base_ref, pr.base_sha),
        "_links": {"self": {"href": u}, "html": {"href": html}, "issue": {"href": issue},
                   "comments": {"href": f"{issue}/comments"},
                   "review_comments": {"href": f"{u}/comments"},
                   "review_comment": {
                       "href": f"{r.repo_url(repo)}/pulls/comments{{/number}}"},
                   "commits": {"href": f"{u}/commits"}, "statuses": {"href": statuses}},
        "author_association": r.association(repo, pr.user), "auto_merge": None,
        "active_lock_reason": None, "merged": False, "mergeable": None, "rebaseable": None,
        "mergeable_state": "unknown", "merged_by": None, "comments": 0,
        "review_comments": 0, "maintainer_can_modify": False, "commits": pr.commits,
        "additions": sum(f["additions"] for f in changed),
        "deletions": sum(f["deletions"] for f in changed), "changed_files": len(changed),
    }


def pull_request_event(forge: LocalForge, repo: Repo, pr: PullRequest, action: str,
                       sender: str, extra: dict[str, Any]) -> None:
    r = Renderer(forge)
    emit(forge, "pull_request", action, repo, sender,
         {"number": pr.number, **extra, "pull_request": pull_request(r, repo, pr)})


def _lines(text: str | None) -> int:
    return len(text.splitlines()) if text else 0


def diff(repo: Repo, pr: PullRequest) -> list[Json]:
    """The pull request's changed files against the tree its branch was made from."""
    b = repo.branches.get(pr.head_ref)
    head = repo.commits[pr.head_sha].files if pr.head_sha in repo.commits else \
        (b.files if b else {})
    base = b.base_files if b else repo.files
    out = []
    for path in sorted(set(head) | set(base)):
        old, new = base.get(path), head.get(path)
        if old == new:
            continue
        status = "added" if old is None else "removed" if new is None else "modified"
        # line counts without a diff: every old line out, every new line in
        adds, dels = (_lines(new), _lines(old)) if status != "modified" else \
            (len(set((new or "").splitlines()) - set((old or "").splitlines())),
             len(set((old or "").splitlines()) - set((new or "").splitlines())))
        out.append({"path": path, "text": new if new is not None else old or "",
                    "status": status, "additions": adds, "deletions": dels})
    return out


def diff_entry(r: Renderer, repo: Repo, pr: PullRequest, f: Json) -> Json:
    path, sha = str(f["path"]), blob_sha(str(f["text"]).encode())
    ref = pr.head_sha if f["status"] != "removed" else pr.base_sha
    return {"sha": sha, "filename": path, "status": f["status"],
            "additions": f["additions"], "deletions": f["deletions"],
            "changes": f["additions"] + f["deletions"],
            "blob_url": f"{r.web}/{repo.full_name}/blob/{ref}/{quote(path)}",
            "raw_url": f"{r.web}/{repo.full_name}/raw/{ref}/{quote(path)}",
            "contents_url": f"{r.repo_url(repo)}/contents/{quote(path)}?ref={ref}"}


def _suite_id(app_id: int, sha: str) -> int:
    return int(hashlib.sha1(f"{app_id}:{sha}".encode()).hexdigest()[:8], 16)


def _pr_minimal(r: Renderer, repo: Repo, pr: PullRequest) -> Json:
    brief = {"id": repo.id, "url": r.repo_url(repo), "name": repo.name}
    return {"id": pr.id, "number": pr.number, "url": f"{r.repo_url(repo)}/pulls/{pr.number}",
            "head": {"ref": pr.head_ref, "sha": pr.head_sha, "repo": brief},
            "base": {"ref": pr.base_ref, "sha": pr.base_sha, "repo": brief}}


def check_run(r: Renderer, repo: Repo, run: CheckRun) -> Json:
    u = f"{r.repo_url(repo)}/check-runs/{run.id}"
    html = f"{r.web}/{repo.full_name}/runs/{run.id}"
    app = r.state.apps.get(run.app_id)
    return {
        "id": run.id, "name": run.name, "node_id": node_id("CheckRun", run.id),
        "head_sha": run.head_sha, "external_id": run.external_id or "", "url": u,
        "html_url": html, "details_url": run.details_url or html, "status": run.status,
        "conclusion": run.conclusion, "started_at": iso(run.started_at),
        "completed_at": iso(run.completed_at) if run.completed_at is not None else None,
        "output": {"title": run.title, "summary": run.summary, "text": run.text,
                   "annotations_count": len(run.annotations),
                   "annotations_url": f"{u}/annotations"},
        "check_suite": {"id": _suite_id(run.app_id, run.head_sha)},
        "app": r.integration(app) if app else None,
        "pull_requests": [_pr_minimal(r, repo, pr) for pr in repo.pulls.values()
                          if pr.state == "open" and pr.head_sha == run.head_sha],
    }


def annotation(r: Renderer, repo: Repo, run: CheckRun, a: Json) -> Json:
    return {"path": a["path"], "start_line": a["start_line"], "end_line": a["end_line"],
            "start_column": a.get("start_column"), "end_column": a.get("end_column"),
            "annotation_level": a["annotation_level"], "title": a.get("title"),
            "message": a["message"], "raw_details": a.get("raw_details"),
            "blob_href": f"{r.web}/{repo.full_name}/blob/{run.head_sha}/{quote(a['path'])}"}


# -- routes --------------------------------------------------------------------------------
def _pull(ctx: Ctx, repo: Repo) -> PullRequest:
    try:
        pr = repo.pulls.get(int(ctx.request.match_info["pull_number"]))
    except ValueError:
        pr = None
    if pr is None:
        raise ApiError(404, "Not Found")
    return pr


async def get_pull(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = ctx.repo(scope="pull_requests")
    return json_response(pull_request(ctx.r, repo, _pull(ctx, repo)))


async def list_pull_files(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = ctx.repo(scope="pull_requests")
    pr = _pull(ctx, repo)
    entries = [diff_entry(ctx.r, repo, pr, f) for f in diff(repo, pr)]
    chunk, headers = paginate(request, entries, ctx.forge.url)
    return json_response(chunk, headers=headers)


def _checks_writer(ctx: Ctx) -> Repo:
    ctx.require_auth()
    if ctx.principal.kind != "installation":
        # GitHub: "OAuth apps and authenticated users are not able to create a check suite"
        raise ApiError(403, "You must authenticate via a GitHub App.")
    return ctx.repo(scope="checks", need="write")


def _text(body: Json, key: str, resource: str = "CheckRun") -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise invalid(resource, key)
    return value


def _output(body: Json, run: CheckRun) -> None:
    out = body.get("output")
    if out is None:
        return
    if not isinstance(out, dict):
        raise invalid("CheckRun", "output")
    for key in ("title", "summary"):
        if not isinstance(out.get(key), str) or not out[key]:
            raise invalid("CheckRun", f"output.{key}", "missing_field")
    for key in ("summary", "text"):
        value = out.get(key)
        if isinstance(value, str) and len(value) > MAX_OUTPUT_TEXT:  # GitHub's own words
            raise ApiError(422, f"Invalid request.\n\nOnly {MAX_OUTPUT_TEXT} characters are "
                                f"allowed; {len(value)} were supplied.")
    notes = out.get("annotations") or []
    if not isinstance(notes, list) or len(notes) > MAX_ANNOTATIONS:
        raise ApiError(422, "Validation Failed", [{
            "resource": "CheckRun", "code": "custom", "field": "output.annotations",
            "message": f"at most {MAX_ANNOTATIONS} annotations a request"}])
    added = []
    for a in notes:
        if not isinstance(a, dict):
            raise invalid("CheckRun", "output.annotations")
        for key, kind in (("path", str), ("start_line", int), ("end_line", int),
                          ("annotation_level", str), ("message", str)):
            if not isinstance(a.get(key), kind):
                raise invalid("CheckRun", f"output.annotations.{key}", "missing_field")
        if a["annotation_level"] not in LEVELS:
            raise invalid("CheckRun", "output.annotations.annotation_level")
        columns = {k: a[k] for k in ("start_column", "end_column") if a.get(k) is not None}
        if columns and a["start_line"] != a["end_line"]:
            raise ApiError(422, "Validation Failed", [{
                "resource": "CheckRun", "code": "custom", "field": "output.annotations",
                "message": "start_column and end_column may only be given when start_line "
                           "and end_line are the same"}])
        added.append({"path": a["path"], "start_line": a["start_line"],
                      "end_line": a["end_line"], **columns,
                      "annotation_level": a["annotation_level"], "message": a["message"],
                      "title": a.get("title"), "raw_details": a.get("raw_details")})
    run.title, run.summary, run.text = out["title"], out["summary"], out.get("text")
    run.annotations = [*run.annotations, *added]


def _state(ctx: Ctx, body: Json, run: CheckRun) -> None:
    status, conclusion = body.get("status"), body.get("conclusion")
    if status is not None and status not in STATUSES:
        raise invalid("CheckRun", "status")
    if conclusion is not None and conclusion not in CONCLUSIONS:
        raise invalid("CheckRun", "conclusion")
    for key in ("started_at", "completed_at"):
        if body.get(key) is not None:
            try:
                setattr(run, key, parse_iso(str(body[key])))
            except ValueError:
                raise invalid("CheckRun", key) from None
    if status is not None:
        run.status = status
    if conclusion is not None:
        run.status, run.conclusion = "completed", conclusion
    if run.status == "completed":
        if run.conclusion is None:
            raise invalid("CheckRun", "conclusion", "missing_field")
        if run.completed_at is None:
            run.completed_at = ctx.forge.clock.now()
    for key in ("details_url", "external_id"):
        if key in body:
            setattr(run, key, _text(body, key))


async def create_check_run(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = _checks_writer(ctx)
    body = await ctx.body()
    name, head_sha = _text(body, "name"), _text(body, "head_sha")
    if not name:
        raise invalid("CheckRun", "name", "missing_field")
    if not head_sha:
        raise invalid("CheckRun", "head_sha", "missing_field")
    if _sha_of(repo, head_sha) != head_sha:
        raise ApiError(422, f"No commit found for SHA: {head_sha}")
    assert ctx.principal.app is not None
    run = CheckRun(id=ctx.forge.state.next_id("check_run"), app_id=ctx.principal.app.id,
                   name=name, head_sha=head_sha, started_at=ctx.forge.clock.now())
    _state(ctx, body, run)
    _output(body, run)
    repo.check_runs[run.id] = run
    url = f"{ctx.r.repo_url(repo)}/check-runs/{run.id}"
    return json_response(check_run(ctx.r, repo, run), 201, {"Location": url})


def _run(ctx: Ctx, repo: Repo) -> CheckRun:
    try:
        run = repo.check_runs.get(int(ctx.request.match_info["check_run_id"]))
    except ValueError:
        run = None
    if run is None:
        raise ApiError(404, "Not Found")
    return run


async def update_check_run(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = _checks_writer(ctx)
    run = _run(ctx, repo)
    assert ctx.principal.app is not None
    if run.app_id != ctx.principal.app.id:
        raise forbidden(ctx.principal)  # only the App that made a check run updates it
    body = await ctx.body()
    if "name" in body:
        name = _text(body, "name")
        if not name:
            raise invalid("CheckRun", "name")
        run.name = name
    _state(ctx, body, run)
    _output(body, run)
    return json_response(check_run(ctx.r, repo, run))


async def get_check_run(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = ctx.repo(scope="checks")
    return json_response(check_run(ctx.r, repo, _run(ctx, repo)))


async def list_annotations(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = ctx.repo(scope="checks")
    run = _run(ctx, repo)
    chunk, headers = paginate(request, [annotation(ctx.r, repo, run, a)
                                        for a in run.annotations], ctx.forge.url)
    return json_response(chunk, headers=headers)


async def list_for_ref(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    repo = ctx.repo(scope="checks")
    ref = request.match_info["ref"]
    sha = _sha_of(repo, ref)
    if sha is None:
        raise ApiError(422, f"No commit found for SHA: {ref}")
    q = request.query
    status, filt = q.get("status"), q.get("filter", "latest")
    if status is not None and status not in STATUSES:
        raise invalid("Query", "status")
    if filt not in ("latest", "all"):
        raise invalid("Query", "filter")
    app_id = int_param(request, "app_id", 0)
    runs = sorted((r for r in repo.check_runs.values() if r.head_sha == sha), key=lambda r: -r.id)
    runs = [r for r in runs if (not q.get("check_name") or r.name == q["check_name"])
            and (status is None or r.status == status) and (not app_id or r.app_id == app_id)]
    if filt == "latest":
        seen: set[tuple[int, str]] = set()
        latest = []
        for r in runs:
            if (r.app_id, r.name) not in seen:
                seen.add((r.app_id, r.name))
                latest.append(r)
        runs = latest
    chunk, headers = paginate(request, runs, ctx.forge.url)
    return json_response({"total_count": len(runs),
                          "check_runs": [check_run(ctx.r, repo, r) for r in chunk]},
                         headers=headers)


def register(routes: Routes) -> None:
    routes.add("GET", "/repos/{owner}/{repo}/pulls/{pull_number}", get_pull)
    routes.add("GET", "/repos/{owner}/{repo}/pulls/{pull_number}/files", list_pull_files)
    routes.add("POST", "/repos/{owner}/{repo}/check-runs", create_check_run)
    routes.add("GET", "/repos/{owner}/{repo}/check-runs/{check_run_id}", get_check_run)
    routes.add("PATCH", "/repos/{owner}/{repo}/check-runs/{check_run_id}", update_check_run)
    routes.add("GET", "/repos/{owner}/{repo}/check-runs/{check_run_id}/annotations",
               list_annotations)
    routes.add("GET", "/repos/{owner}/{repo}/commits/{ref}/check-runs", list_for_ref)
