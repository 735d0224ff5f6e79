"""Webhooks as Gitea sends them (services/webhook/deliver.go, modules/structs/hook.go).

Gitea has no Apps: an organisation webhook (`POST /orgs/{org}/hooks`) fires for every repository
of the org. The forge keeps each org hook in its dialect-neutral state as an `App` record (URL,
secret, events, `hook_id`) with an all-repositories `Installation` on the org (its scope), so the
shared dispatcher delivers it; neither record is visible through the Gitea API.

Payloads: `IssuePayload` {action, number, changes?, issue, repository, sender, commit_id} (no
`installation`, no `organization`); label changes are `label_updated` / `label_cleared` with the
issue's whole label list and no `label` object; `IssueCommentPayload` carries `is_pull`.
Headers: X-Gitea-{Delivery,Event,Event-Type,Signature} (bare hex HMAC-SHA256 of the body), the
X-Gogs-* and X-Forgejo-* twins, X-GitHub-Delivery/Event and X-Hub-Signature(-256).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import TYPE_CHECKING, Any

from ..clock import iso
from ..state import App, Delivery, Installation, Repo
from .render import GiteaRenderer

if TYPE_CHECKING:
    from ..forge import LocalForge

# Gitea's "issues" event switch enables every issue hook type (routers/api/v1/utils/hook.go).
ISSUE_TYPES = {"issues", "issues_only", "issue_assign", "issue_label", "issue_milestone",
               "issue_comment"}
HOOK_SLUG = "gitea-org-hook-"


def hook_type(event: str, action: str | None) -> str:
    """The hook type Gitea shows in X-Gitea-Event-Type (its event header stays `issues`)."""
    if event == "issues":
        if action in ("label_updated", "label_cleared"):
            return "issue_label"
        if action in ("assigned", "unassigned"):
            return "issue_assign"
        if action in ("milestoned", "demilestoned"):
            return "issue_milestone"
        return "issues"
    return event


def subscribed(hook: App, event: str, action: str | None) -> bool:
    kind = hook_type(event, action)
    events = set(hook.events)
    if "*" in events or kind in events or event in events:
        return True
    return kind in ISSUE_TYPES and "issues" in events


def is_org_hook(app: App) -> bool:
    return app.slug.startswith(HOOK_SLUG)


def add_org_hook(forge: LocalForge, org: str, url: str, secret: str | None,
                 events: list[str], active: bool = True) -> App:
    """Register an org webhook; returns its record (`hook_id` is the id Gitea shows)."""
    acct = forge.state.account(org)
    if acct is None or forge.state.org(org) is None:
        raise KeyError(f"no org {org!r}")
    now = forge.clock.now()
    hook_id = forge.state.next_id("hook")
    app = App(id=forge.state.next_id("app"), slug=f"{HOOK_SLUG}{hook_id}",
              name=f"org hook {hook_id}", owner=acct.login, public_key_pem="",
              webhook_url=url if active else None, webhook_secret=secret or None,
              events=list(events), permissions={}, created_at=now, client_id="",
              hook_id=hook_id, bot_login="")
    forge.state.apps[app.id] = app
    inst = Installation(id=forge.state.next_id("installation"), app_id=app.id,
                        account=acct.login, created_at=now, updated_at=now)
    forge.state.installations[inst.id] = inst
    forge.save()
    return app


def org_hooks(forge: LocalForge, org: str) -> list[tuple[App, Installation]]:
    out = []
    for inst in forge.state.installations.values():
        app = forge.state.apps.get(inst.app_id)
        if app is not None and is_org_hook(app) and inst.account.lower() == org.lower():
            out.append((app, inst))
    return out


def emit(forge: LocalForge, event: str, action: str | None, repo: Repo, sender: str,
         body: dict[str, Any]) -> None:
    """Queue `event` for every org hook of the repository's owner that subscribes to it."""
    r = GiteaRenderer(forge)
    for inst in forge.state.installations_for_repo(repo):
        app = forge.state.apps.get(inst.app_id)
        if app is None or not is_org_hook(app) or not subscribed(app, event, action):
            continue
        payload: dict[str, Any] = {"action": action} if action is not None else {}
        payload.update(body)
        payload["repository"] = r.repo(repo)
        payload["sender"] = r.user(sender)
        forge.webhooks.enqueue(app, event, action, payload, inst.id, repo.id)


def issue_event(forge: LocalForge, action: str, repo: Repo, sender: str, issue: Any,
                changes: dict[str, Any] | None = None) -> None:
    r = GiteaRenderer(forge)
    body: dict[str, Any] = {"number": issue.number}
    if changes:
        body["changes"] = changes
    body["issue"] = r.issue(repo, issue)
    body["commit_id"] = ""
    emit(forge, "issues", action, repo, sender, body)


def comment_event(forge: LocalForge, action: str, repo: Repo, sender: str, issue: Any,
                  comment: dict[str, Any], changes: dict[str, Any] | None = None) -> None:
    r = GiteaRenderer(forge)
    body: dict[str, Any] = {"issue": r.issue(repo, issue), "pull_request": None,
                            "comment": comment}
    if changes:
        body["changes"] = changes
    body["is_pull"] = False
    emit(forge, "issue_comment", action, repo, sender, body)


def pushed(forge: LocalForge, repo: Repo, pusher: str, path: str, existed: bool) -> None:
    """A one-file commit to the default branch, as Gitea's PushPayload."""
    r = GiteaRenderer(forge)
    before, after = secrets.token_hex(20), secrets.token_hex(20)
    user = forge.state.account(pusher)
    who = {"name": pusher, "email": (user.email if user and user.email else
                                     f"{pusher.lower()}@noreply.localhost"),
           "username": pusher}
    commit = {"id": after, "message": f"Update {path}\n",
              "url": f"{forge.url}/{repo.full_name}/commit/{after}", "author": who,
              "committer": who, "verification": None, "timestamp": iso(forge.clock.now()),
              "added": [] if existed else [path], "removed": [],
              "modified": [path] if existed else []}
    emit(forge, "push", None, repo, pusher, {
        "ref": f"refs/heads/{repo.default_branch}", "before": before, "after": after,
        "compare_url": f"{forge.url}/{repo.full_name}/compare/{before}...{after}",
        "commits": [commit], "total_commits": 1, "head_commit": commit,
        "pusher": r.user(pusher)})


def repo_created(forge: LocalForge, repo: Repo, sender: str) -> None:
    r = GiteaRenderer(forge)
    emit(forge, "repository", "created", repo, sender,
         {"organization": r.user(repo.owner)})


def delivery_headers(forge: LocalForge, app: App, delivery: Delivery,
                     body: bytes) -> dict[str, str]:
    kind = hook_type(delivery.event, delivery.action)
    sig = ""
    sig256 = sig1 = ""
    if app.webhook_secret:
        key = app.webhook_secret.encode()
        sig = hmac.new(key, body, hashlib.sha256).hexdigest()
        sig256 = "sha256=" + sig
        sig1 = "sha1=" + hmac.new(key, body, hashlib.sha1).hexdigest()
    headers = {"Content-Type": "application/json", "User-Agent": "Go-http-client/1.1"}
    for prefix in ("X-Gitea", "X-Gogs", "X-Forgejo"):
        headers[f"{prefix}-Delivery"] = delivery.guid
        headers[f"{prefix}-Event"] = delivery.event
        headers[f"{prefix}-Event-Type"] = kind
        headers[f"{prefix}-Signature"] = sig
    headers.update({"X-GitHub-Delivery": delivery.guid, "X-GitHub-Event": delivery.event,
                    "X-GitHub-Event-Type": kind, "X-Hub-Signature": sig1,
                    "X-Hub-Signature-256": sig256})
    return headers
