"""GitHub's JSON shapes, rendered from the forge state with URLs on the forge's own base URL."""

from __future__ import annotations

import base64
import hashlib
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ..clock import iso
from ..state import (
    Account,
    App,
    Comment,
    Delivery,
    Event,
    Installation,
    Issue,
    IssueField,
    IssueFieldValue,
    IssueType,
    Label,
    Reaction,
    Repo,
    State,
    perm_rank,
)

if TYPE_CHECKING:
    from ..forge import LocalForge

CONTENTS_AT_MOST = 1024 * 1024  # a file the contents API gives in JSON (GitHub: "1 MB")
REACTIONS = ("+1", "-1", "laugh", "confused", "heart", "hooray", "eyes", "rocket")
Json = dict[str, Any]


def blob_sha(raw: bytes) -> str:
    """A file's git blob sha (what the contents API calls its sha)."""
    return hashlib.sha1(b"blob %d\0" % len(raw) + raw).hexdigest()


# the key naming the other issue in a timeline event, by the event's name before _added/_removed
REFERENCE_KEYS = ("blocked_by", "blocking", "sub_issue", "parent_issue")
_SIMPLE_REPOSITORY = frozenset((
    "archive_url", "assignees_url", "blobs_url", "branches_url", "collaborators_url",
    "comments_url", "commits_url", "compare_url", "contents_url", "contributors_url",
    "deployments_url", "description", "downloads_url", "events_url", "fork", "forks_url",
    "full_name", "git_commits_url", "git_refs_url", "git_tags_url", "hooks_url", "html_url",
    "id", "node_id", "issue_comment_url", "issue_events_url", "issues_url", "keys_url",
    "labels_url", "languages_url", "merges_url", "milestones_url", "name",
    "notifications_url", "owner", "private", "pulls_url", "releases_url", "stargazers_url",
    "statuses_url", "subscribers_url", "subscription_url", "tags_url", "teams_url",
    "trees_url", "url"))


def node_id(kind: str, ident: int) -> str:
    return base64.b64encode(f"0{len(kind)}:{kind}{ident}".encode()).decode()


def role_permissions(role: str | None) -> dict[str, bool]:
    r = perm_rank(role)
    return {"admin": r >= 5, "maintain": r >= 4, "push": r >= 3, "triage": r >= 2, "pull": r >= 1}


class Renderer:
    """GitHub's shapes (2022-11-28's; the server trims a 2026-03-10 answer, versions.shape)."""

    def __init__(self, forge: LocalForge) -> None:
        self.forge = forge
        self.state: State = forge.state
        self.api = forge.url
        self.web = forge.url

    # -- users and orgs ----------------------------------------------------------------
    def user(self, login: str | Account | None) -> Json | None:
        acct = login if isinstance(login, Account) else (
            self.state.account(login) if login else None)
        if acct is None:
            return None
        q = quote(acct.login)
        u = f"{self.api}/users/{q}"
        is_org = acct.type == "Organization"
        html = (f"{self.web}/apps/{quote(acct.login.removesuffix('[bot]'))}"
                if acct.type == "Bot" else f"{self.web}/{q}")
        return {
            "login": acct.login, "id": acct.id,
            "node_id": node_id("Bot" if acct.type == "Bot" else
                               "Organization" if is_org else "User", acct.id),
            "avatar_url": f"{self.web}/avatars/u/{acct.id}?v=4", "gravatar_id": "",
            "url": u, "html_url": html,
            "followers_url": f"{u}/followers",
            "following_url": f"{u}/following{{/other_user}}",
            "gists_url": f"{u}/gists{{/gist_id}}",
            "starred_url": f"{u}/starred{{/owner}}{{/repo}}",
            "subscriptions_url": f"{u}/subscriptions",
            "organizations_url": f"{u}/orgs",
            "repos_url": f"{self.api}/orgs/{q}/repos" if is_org else f"{u}/repos",
            "events_url": f"{self.api}/orgs/{q}/events" if is_org else f"{u}/events{{/privacy}}",
            "received_events_url": f"{u}/received_events",
            "type": acct.type, "user_view_type": "public", "site_admin": False,
        }

    def user_req(self, login: str | Account) -> Json:
        out = self.user(login)
        assert out is not None
        return out

    def public_user(self, acct: Account) -> Json:
        out = self.user_req(acct)
        repos = sum(1 for r in self.state.repos.values()
                    if r.owner.lower() == acct.login.lower() and not r.private)
        out.update({
            "name": acct.name, "company": None, "blog": "", "location": None,
            "email": acct.email, "hireable": None, "bio": None, "twitter_username": None,
            "public_repos": repos, "public_gists": 0, "followers": 0, "following": 0,
            "created_at": iso(acct.created_at), "updated_at": iso(acct.updated_at),
        })
        return out

    def org_simple(self, login: str) -> Json:
        acct = self.state.account(login)
        assert acct is not None
        org = self.state.org(login)
        q = quote(acct.login)
        u = f"{self.api}/orgs/{q}"
        return {
            "login": acct.login, "id": acct.id, "node_id": node_id("Organization", acct.id),
            "url": u, "repos_url": f"{u}/repos", "events_url": f"{u}/events",
            "hooks_url": f"{u}/hooks", "issues_url": f"{u}/issues",
            "members_url": f"{u}/members{{/member}}",
            "public_members_url": f"{u}/public_members{{/member}}",
            "avatar_url": f"{self.web}/avatars/u/{acct.id}?v=4",
            "description": (org.description if org else None) or "",
        }

    # -- repositories ------------------------------------------------------------------
    def repo_url(self, repo: Repo) -> str:
        return f"{self.api}/repos/{quote(repo.owner)}/{quote(repo.name)}"

    def repo_minimal(self, repo: Repo, role: str | None = None) -> Json:
        u = self.repo_url(repo)
        out: Json = {
            "id": repo.id, "node_id": node_id("Repository", repo.id), "name": repo.name,
            "full_name": repo.full_name, "private": repo.private,
            "owner": self.user_req(repo.owner),
            "html_url": f"{self.web}/{repo.full_name}", "description": repo.description,
            "fork": False, "url": u,
            "forks_url": f"{u}/forks", "keys_url": f"{u}/keys{{/key_id}}",
            "collaborators_url": f"{u}/collaborators{{/collaborator}}",
            "teams_url": f"{u}/teams", "hooks_url": f"{u}/hooks",
            "issue_events_url": f"{u}/issues/events{{/number}}",
            "events_url": f"{u}/events", "assignees_url": f"{u}/assignees{{/user}}",
            "branches_url": f"{u}/branches{{/branch}}", "tags_url": f"{u}/tags",
            "blobs_url": f"{u}/git/blobs{{/sha}}", "git_tags_url": f"{u}/git/tags{{/sha}}",
            "git_refs_url": f"{u}/git/refs{{/sha}}", "trees_url": f"{u}/git/trees{{/sha}}",
            "statuses_url": f"{u}/statuses/{{sha}}", "languages_url": f"{u}/languages",
            "stargazers_url": f"{u}/stargazers", "contributors_url": f"{u}/contributors",
            "subscribers_url": f"{u}/subscribers", "subscription_url": f"{u}/subscription",
            "commits_url": f"{u}/commits{{/sha}}", "git_commits_url": f"{u}/git/commits{{/sha}}",
            "comments_url": f"{u}/comments{{/number}}",
            "issue_comment_url": f"{u}/issues/comments{{/number}}",
            "contents_url": f"{u}/contents/{{+path}}",
            "compare_url": f"{u}/compare/{{base}}...{{head}}", "merges_url": f"{u}/merges",
            "archive_url": f"{u}/{{archive_format}}{{/ref}}", "downloads_url": f"{u}/downloads",
            "issues_url": f"{u}/issues{{/number}}", "pulls_url": f"{u}/pulls{{/number}}",
            "milestones_url": f"{u}/milestones{{/number}}",
            "notifications_url": f"{u}/notifications{{?since,all,participating}}",
            "labels_url": f"{u}/labels{{/name}}", "releases_url": f"{u}/releases{{/id}}",
            "deployments_url": f"{u}/deployments",
            "git_url": f"git://{self.web.split('://', 1)[-1]}/{repo.full_name}.git",
            "ssh_url": f"git@localforge:{repo.full_name}.git",
            "clone_url": f"{self.web}/{repo.full_name}.git",
            "svn_url": f"{self.web}/{repo.full_name}",
            "mirror_url": None, "homepage": None, "language": None,
            "forks_count": 0, "stargazers_count": 0, "watchers_count": 0, "size": 0,
            "default_branch": repo.default_branch,
            "open_issues_count": repo.open_issue_count(), "is_template": False, "topics": [],
            "has_issues": repo.has_issues, "has_projects": False, "has_wiki": False,
            "has_pages": False, "has_downloads": True, "has_discussions": False,
            "archived": repo.archived, "disabled": False,
            "visibility": "private" if repo.private else "public",
            "pushed_at": iso(repo.pushed_at), "created_at": iso(repo.created_at),
            "updated_at": iso(repo.updated_at),
            "allow_forking": False, "web_commit_signoff_required": False,
            "forks": 0, "open_issues": repo.open_issue_count(), "watchers": 0,
            "license": None,
        }
        if role is not None:
            out["permissions"] = role_permissions(role)
        return out

    def repo_full(self, repo: Repo, role: str | None = None) -> Json:
        out = self.repo_minimal(repo, role)
        out.update({
            "network_count": 0, "subscribers_count": 0, "allow_auto_merge": False,
            "allow_merge_commit": True, "allow_rebase_merge": True,
            "allow_squash_merge": True, "allow_update_branch": False,
            "delete_branch_on_merge": False, "custom_properties": {},
        })
        if self.state.org(repo.owner) is not None:
            out["organization"] = self.user_req(repo.owner)
        return out

    def repo_hook(self, repo: Repo) -> Json:
        """The `repository` object of webhook payloads."""
        out = self.repo_full(repo)
        out.pop("organization", None)
        return out

    # -- labels, issues, comments ------------------------------------------------------
    def label(self, repo: Repo, label: Label) -> Json:
        return {
            "id": label.id, "node_id": node_id("Label", label.id),
            "url": f"{self.repo_url(repo)}/labels/{quote(label.name, safe=':')}",
            "name": label.name, "color": label.color, "description": label.description,
            "default": label.default,
            # the forge never archives labels (GitHub's newer descriptions require both)
            "archived_at": None, "archived_by": None,
        }

    def reactions_rollup(self, url: str, reactions: list[Reaction]) -> Json:
        out: Json = {"url": url, "total_count": len(reactions)}
        for c in REACTIONS:
            out[c] = sum(1 for r in reactions if r.content == c)
        return out

    def association(self, repo: Repo, login: str) -> str:
        low = login.lower()
        if repo.owner.lower() == low:
            return "OWNER"
        org = self.state.org(repo.owner)
        if org is not None and low in (m.lower() for m in org.members):
            return "MEMBER"
        if low in repo.collaborators:
            return "COLLABORATOR"
        return "NONE"

    def integration(self, app: App) -> Json:
        owner = self.state.account(app.owner)
        return {
            "id": app.id, "slug": app.slug, "node_id": node_id("Integration", app.id),
            "client_id": app.client_id,
            "owner": self.user(owner) if owner else None, "name": app.name,
            "description": app.description, "external_url": app.external_url or self.web,
            "html_url": f"{self.web}/apps/{app.slug}", "created_at": iso(app.created_at),
            "updated_at": iso(app.created_at), "permissions": dict(app.permissions),
            "events": list(app.events),
        }

    def via_app(self, app_id: int | None) -> Json | None:
        app = self.state.apps.get(app_id) if app_id is not None else None
        return self.integration(app) if app else None

    def issue(self, repo: Repo, issue: Issue) -> Json:
        u = f"{self.repo_url(repo)}/issues/{issue.number}"
        labels = [self.label(repo, lb) for lid in issue.labels
                  if (lb := repo.label_by_id(lid)) is not None]
        assignees = [a for a in (self.user(x) for x in issue.assignees) if a]
        return {
            "url": u, "repository_url": self.repo_url(repo),
            "labels_url": f"{u}/labels{{/name}}", "comments_url": f"{u}/comments",
            "events_url": f"{u}/events",
            "html_url": f"{self.web}/{repo.full_name}/issues/{issue.number}",
            "id": issue.id, "node_id": node_id("Issue", issue.id), "number": issue.number,
            "title": issue.title, "user": self.user(issue.user), "labels": labels,
            "state": issue.state, "locked": issue.locked,
            "assignee": assignees[0] if assignees else None, "assignees": assignees,
            "milestone": None, "comments": len(issue.comment_ids),
            "created_at": iso(issue.created_at), "updated_at": iso(issue.updated_at),
            "closed_at": iso(issue.closed_at) if issue.closed_at else None,
            "author_association": self.association(repo, issue.user),
            "type": self.issue_type_of(repo, issue), "active_lock_reason": None,
            "sub_issues_summary": self.sub_issues_summary(issue),
            "parent_issue_url": self.parent_issue_url(issue),
            "issue_dependencies_summary": self.dependencies_summary(issue),
            "issue_field_values": self.issue_field_values(repo, issue),
            "body": issue.body,
            "closed_by": self.user(issue.closed_by) if issue.closed_by else None,
            "reactions": self.reactions_rollup(f"{u}/reactions", issue.reactions),
            "timeline_url": f"{u}/timeline",
            "performed_via_github_app": self.via_app(issue.via_app),
            "state_reason": issue.state_reason, "pinned_comment": None,
        }

    # -- issue types and sub-issues ----------------------------------------------------
    def issue_type(self, t: IssueType) -> Json:
        """The `issue-type` schema (GET /orgs/{org}/issue-types, an issue's `type`)."""
        return {"id": t.id, "node_id": node_id("IssueType", t.id), "name": t.name,
                "description": t.description, "color": t.color,
                "created_at": iso(t.created_at), "updated_at": iso(t.updated_at),
                "is_enabled": t.is_enabled}

    def issue_field(self, f: IssueField) -> Json:
        """The `issue-field` schema (GET /orgs/{org}/issue-fields)."""
        selects = f.data_type in ("single_select", "multi_select")
        return {"id": f.id, "node_id": node_id("IssueField", f.id), "name": f.name,
                "description": f.description, "data_type": f.data_type,
                "visibility": f.visibility,
                "options": [{"id": o.id, "name": o.name, "description": o.description,
                             "color": o.color, "priority": o.priority,
                             "created_at": iso(o.created_at), "updated_at": iso(o.updated_at)}
                            for o in f.options] if selects else None,
                "created_at": iso(f.created_at), "updated_at": iso(f.updated_at)}

    def issue_field_value(self, f: IssueField, v: IssueFieldValue) -> Json:
        """The `issue-field-value` schema: a select field's value is its option's name."""
        chosen = [o for i in v.option_ids for o in f.options if o.id == i]
        picked = [{"id": o.id, "name": o.name, "color": o.color or "gray"} for o in chosen]
        value: str | float | None = v.value
        if f.data_type == "single_select":
            value = chosen[0].name if chosen else None
        elif f.data_type == "multi_select":
            value = ", ".join(o.name for o in chosen) or None
        return {"issue_field_id": f.id, "issue_field_name": f.name,
                "node_id": node_id("IssueFieldValue", v.id), "data_type": f.data_type,
                "value": value,
                "single_select_option": picked[0] if f.data_type == "single_select"
                and picked else None,
                "multi_select_options": picked if f.data_type == "multi_select" else None}

    def issue_field_values(self, repo: Repo, issue: Issue) -> list[Json]:
        org = self.state.org(repo.owner)
        fields = {f.id: f for f in org.issue_fields} if org is not None else {}
        return [self.issue_field_value(fields[v.field_id], v) for v in issue.field_values
                if v.field_id in fields]

    def issue_type_of(self, repo: Repo, issue: Issue) -> Json | None:
        org = self.state.org(repo.owner)
        found = next((t for t in org.issue_types if t.id == issue.type_id), None) \
            if org is not None and issue.type_id is not None else None
        return self.issue_type(found) if found is not None else None

    def parent_issue_url(self, issue: Issue) -> str | None:
        found = self.state.issue_by_id(issue.parent_id) if issue.parent_id else None
        return f"{self.repo_url(found[0])}/issues/{found[1].number}" if found else None

    def sub_issues_summary(self, issue: Issue) -> Json:
        subs = [f[1] for i in issue.sub_issue_ids if (f := self.state.issue_by_id(i))]
        done = sum(1 for s in subs if s.state == "closed")
        return {"total": len(subs), "completed": done,
                "percent_completed": done * 100 // len(subs) if subs else 0}

    def dependencies_summary(self, issue: Issue) -> Json:
        """`issue-dependencies-summary`: the open issues on each side, and all of them."""
        def still_open(ids: list[int]) -> int:
            return sum(1 for i in ids if (f := self.state.issue_by_id(i))
                       and f[1].state == "open")
        return {"blocked_by": still_open(issue.blocked_by_ids),
                "blocking": still_open(issue.blocking_ids),
                "total_blocked_by": len(issue.blocked_by_ids),
                "total_blocking": len(issue.blocking_ids)}

    def comment(self, repo: Repo, c: Comment) -> Json:
        u = f"{self.repo_url(repo)}/issues/comments/{c.id}"
        return {
            "url": u,
            "html_url": f"{self.web}/{repo.full_name}/issues/{c.issue_number}#issuecomment-{c.id}",
            "issue_url": f"{self.repo_url(repo)}/issues/{c.issue_number}",
            "id": c.id, "node_id": node_id("IssueComment", c.id), "user": self.user(c.user),
            "created_at": iso(c.created_at), "updated_at": iso(c.updated_at),
            "author_association": self.association(repo, c.user), "body": c.body,
            "reactions": self.reactions_rollup(f"{u}/reactions", c.reactions),
            "performed_via_github_app": self.via_app(c.via_app),
            "minimized": None, "pin": None,
        }

    def reaction(self, r: Reaction) -> Json:
        return {"id": r.id, "node_id": node_id("Reaction", r.id), "user": self.user(r.user),
                "content": r.content, "created_at": iso(r.created_at)}

    def timeline_event(self, repo: Repo, issue: Issue, e: Event) -> Json:
        out: Json = {
            "id": e.id, "node_id": node_id("IssueEvent", e.id),
            "url": f"{self.repo_url(repo)}/issues/events/{e.id}",
            "actor": self.user(e.actor), "event": e.event, "commit_id": None,
            "commit_url": None, "created_at": iso(e.created_at),
            "performed_via_github_app": self.via_app(e.via_app),
        }
        if e.label is not None:
            out["label"] = {"name": e.label.get("name", ""), "color": e.label.get("color", "")}
        if e.rename is not None:
            out["rename"] = dict(e.rename)
        if e.event in ("closed", "reopened"):
            out["state_reason"] = e.state_reason
        if e.assignee is not None:
            out["assignee"] = self.user(e.assignee)
        key = next((k for k in REFERENCE_KEYS if e.event.startswith(k + "_")), None)
        if key is not None:
            found = self.state.issue_by_id(e.issue_ref) if e.issue_ref is not None else None
            out[key] = self.issue_reference(*found) if found is not None else None
        return out

    def issue_reference(self, repo: Repo, issue: Issue) -> Json:
        """The `nullable-issue-reference` schema: the other issue of a dependency or sub-issue
        timeline event, as it is now."""
        t = self.issue_type_of(repo, issue)
        return {"number": issue.number, "title": issue.title, "state": issue.state,
                "state_reason": issue.state_reason,
                "repository": {k: v for k, v in self.repo_minimal(repo).items()
                               if k in _SIMPLE_REPOSITORY},
                "issue_type": {k: t[k] for k in ("id", "node_id", "name", "color")}
                if t is not None else None}

    def timeline_comment(self, repo: Repo, c: Comment) -> Json:
        out = self.comment(repo, c)
        out["event"] = "commented"
        out["actor"] = self.user(c.user)
        return out

    # -- apps --------------------------------------------------------------------------
    def installation(self, inst: Installation, describe_account: bool = False) -> Json:
        """`describe_account` adds name/slug/created_at/updated_at to the account, which the
        REST description of GET /app/installations requires (its account is an allOf of
        simple-user and enterprise)."""
        app = self.state.apps[inst.app_id]
        acct = self.state.account(inst.account)
        is_org = acct is not None and acct.type == "Organization"
        html = (f"{self.web}/organizations/{inst.account}/settings/installations/{inst.id}"
                if is_org else f"{self.web}/settings/installations/{inst.id}")
        # ISO strings, as the webhooks description and GitHub's newer payloads have them
        # (older recorded payloads carry epoch integers).
        created, updated = iso(inst.created_at), iso(inst.updated_at)
        account = self.user(inst.account)
        if describe_account and account is not None and acct is not None:
            account.update({"name": acct.name or acct.login, "slug": acct.login.lower(),
                            "created_at": iso(acct.created_at),
                            "updated_at": iso(acct.updated_at)})
        return {
            "id": inst.id, "client_id": app.client_id, "account": account,
            "repository_selection": inst.repository_selection,
            "access_tokens_url": f"{self.api}/app/installations/{inst.id}/access_tokens",
            "repositories_url": f"{self.api}/installation/repositories", "html_url": html,
            "app_id": app.id, "app_slug": app.slug, "target_id": acct.id if acct else 0,
            "target_type": "Organization" if is_org else "User",
            "permissions": dict(app.permissions), "events": list(app.events),
            "created_at": created, "updated_at": updated, "single_file_name": None,
            "has_multiple_single_files": False, "single_file_paths": [],
            "suspended_by": self.user(inst.suspended_by) if inst.suspended_by else None,
            "suspended_at": iso(inst.suspended_at) if inst.suspended_at is not None else None,
        }

    def delivery_item(self, d: Delivery) -> Json:
        return {
            "id": d.id, "guid": d.guid, "delivered_at": iso(d.delivered_at),
            "redelivery": d.redelivery, "duration": d.duration, "status": d.status,
            "status_code": d.status_code, "event": d.event, "action": d.action,
            "installation_id": d.installation_id, "repository_id": d.repository_id,
            "throttled_at": None,
        }

    def delivery(self, d: Delivery) -> Json:
        out = self.delivery_item(d)
        out.update({
            "url": d.url,
            "request": {"headers": dict(d.request_headers), "payload": d.payload},
            "response": {"headers": dict(d.response_headers), "payload": d.response_payload},
        })
        return out

    # -- contents ----------------------------------------------------------------------
    def file_commit_content(self, repo: Repo, path: str, raw: bytes) -> Json:
        """The `content` of a file-commit (PUT contents): a file without its bytes."""
        out = self.content_file(repo, path, raw)
        for key in ("encoding", "content"):
            out.pop(key)
        return out

    def content_file(self, repo: Repo, path: str, text: str | bytes) -> Json:
        raw = text.encode() if isinstance(text, str) else text
        sha = blob_sha(raw)
        u = f"{self.repo_url(repo)}/contents/{quote(path)}"
        html = f"{self.web}/{repo.full_name}/blob/{repo.default_branch}/{quote(path)}"
        git = f"{self.repo_url(repo)}/git/blobs/{sha}"
        b64 = base64.b64encode(raw).decode()
        wrapped = "\n".join(b64[i:i + 60] for i in range(0, len(b64), 60)) + "\n"
        # GitHub's JSON gives a file of 1 MB at most; a bigger one's is empty, `encoding`
        # "none" (its bytes only through the raw or object media types, up to 100 MB)
        over = len(raw) > CONTENTS_AT_MOST
        return {
            "type": "file", "encoding": "none" if over else "base64", "size": len(raw),
            "name": path.rsplit("/", 1)[-1], "path": path, "content": "" if over else wrapped,
            "sha": sha,
            "url": u, "git_url": git, "html_url": html,
            "download_url": f"{self.web}/{repo.full_name}/raw/{repo.default_branch}/{quote(path)}",
            "_links": {"self": u, "git": git, "html": html},
        }

    def content_dir_object(self, repo: Repo, path: str, entries: list[Json]) -> Json:
        """A directory in the `object` media type: content-tree, its entries inside."""
        out = self.content_dir_entry(repo, path, True)
        out["entries"] = entries
        return out

    def content_dir_entry(self, repo: Repo, path: str, is_dir: bool) -> Json:
        u = f"{self.repo_url(repo)}/contents/{quote(path)}"
        kind = "tree" if is_dir else "blob"  # GitHub's html_url of a file is its blob page
        html = f"{self.web}/{repo.full_name}/{kind}/{repo.default_branch}/{quote(path)}"
        sha = hashlib.sha1(path.encode()).hexdigest()
        git = f"{self.repo_url(repo)}/git/{'trees' if is_dir else 'blobs'}/{sha}"
        raw = None if is_dir else repo.file_bytes(path) or b""
        if raw is not None:  # a file's sha is its git blob's, as GET of the file says
            sha = blob_sha(raw)
            git = f"{self.repo_url(repo)}/git/blobs/{sha}"
        return {
            "type": "dir" if is_dir else "file", "size": 0 if raw is None else len(raw),
            "name": path.rsplit("/", 1)[-1], "path": path, "sha": sha, "url": u,
            "git_url": git, "html_url": html,
            "download_url": None if is_dir else f"{self.web}/{repo.full_name}/raw/"
                                                  f"{repo.default_branch}/{quote(path)}",
            "_links": {"self": u, "git": git, "html": html},
        }
