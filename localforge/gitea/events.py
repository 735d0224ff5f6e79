"""Webhooks as Gitea sends them (services/webhook/deliver.go, modules/structs/hook.go).

Gitea has no Apps: an organisation webhook (`POST /orgs/{org}/hooks`) fires for every repository
of the org. The forge keeps each org hook in its dialect-neutral state as an `App` record (URL,
secret, events, `hook_id`) with an all-repositories `Installation` on the org (its scope), so the
shared dispatcher delivers it; neither record is visible through the Gitea API.

Payloads: `IssuePayload` {action, number, changes?, issue, repository, sender, commit_id} (no
`installation`, no `organization`); label changes are `label_updated` / `label_cleared` with the
issue's whole label list and no `label` object, sent for every label call whatever it changed;
`IssueCommentPayload` carries `is_pull` and no `pull_request` on plain issues. Senders are
rendered with no viewer (the no-reply email). An org hook's events are expanded when it is
created (`hook_events`), as Gitea stores them, and a delivery goes to the hooks whose events
name its hook type.
Headers: X-Gitea-{Delivery,Event,Event-Type,Signature} (bare hex HMAC-SHA256 of the body), the
X-Gogs-* and X-Forgejo-* twins, X-GitHub-Delivery/Event and X-Hub-Signature(-256).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import TYPE_CHECKING, Any

from ..clock import iso
from ..state import Account, App, Delivery, Installation, Repo
from .render import GiteaRenderer

if TYPE_CHECKING:
    from ..forge import LocalForge

# Webhook.EventsArray's order (models/webhook/webhook.go EventCheckers, Gitea 1.22).
EVENTS_ORDER = ("create", "delete", "fork", "push", "issues", "issue_assign", "issue_label",
                "issue_milestone", "issue_comment", "pull_request", "pull_request_assign",
                "pull_request_label", "pull_request_milestone", "pull_request_comment",
                "pull_request_review_approved", "pull_request_review_rejected",
                "pull_request_review_comment", "pull_request_sync", "wiki", "repository",
                "release", "package", "pull_request_review_request")
SIMPLE_EVENTS = ("create", "delete", "fork", "push", "wiki", "repository", "release", "package")
ISSUE_SUB = ("issue_assign", "issue_label", "issue_milestone", "issue_comment")
PULL_SUB = ("pull_request_assign", "pull_request_label", "pull_request_milestone",
            "pull_request_comment", "pull_request_sync", "pull_request_review_request")
HOOK_SLUG = "gitea-org-hook-"


def hook_events(requested: list[str]) -> list[str]:
    """The events a hook created with `requested` has, as the API then shows them
    (routers/api/v1/utils/hook.go addHook + Webhook.EventsArray): none given is ["push"];
    `issues` switches on issues_only and every issue_* type, `pull_request` every
    pull_request_* one; unknown names are dropped; the order is EventsArray's."""
    req = {str(e).lower() for e in requested} or {"push"}
    if "*" in req:  # the Python API's "send everything" (the web UI's choice, not the API's)
        return list(EVENTS_ORDER)

    def issues(name: str) -> bool:
        return name in req or "issues" in req

    def pulls(name: str) -> bool:
        return name in req or "pull_request" in req

    on = {e for e in SIMPLE_EVENTS if e in req}
    on |= {"issues"} if issues("issues_only") else set()
    on |= {e for e in ISSUE_SUB if issues(e)}
    on |= {"pull_request"} if pulls("pull_request_only") else set()
    on |= {e for e in PULL_SUB if pulls(e)}
    if pulls("pull_request_review"):
        on |= {"pull_request_review_approved", "pull_request_review_rejected"}
    if "pull_request_comment" in on:  # EventCheckers pairs review comments with PR comments
        on.add("pull_request_review_comment")
    return [e for e in EVENTS_ORDER if e in on]


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
    """Webhook.HasEvent: the hook type must be one of the hook's (already expanded) events."""
    return hook_type(event, action) in hook.events


def is_org_hook(app: App) -> bool:
    return app.slug.startswith(HOOK_SLUG)


def add_org_hook(forge: LocalForge, org: str, url: str, secret: str | None,
                 events: list[str], active: bool = True) -> App:
    """Register an org webhook; returns its record (`hook_id` is the id Gitea shows, `events`
    the expanded list, as `hook_events`)."""
    acct = forge.state.account(org)
    if acct is None or forge.state.org(org) is None:
        raise KeyError(f"no org {org!r}")
    now = forge.clock.now()
    hook_id = forge.state.next_id("hook")
    app = App(id=forge.state.next_id("app"), slug=f"{HOOK_SLUG}{hook_id}",
              name=f"org hook {hook_id}", owner=acct.login, public_key_pem="",
              webhook_url=url if active else None, webhook_secret=secret or None,
              events=hook_events(events), permissions={}, created_at=now, client_id="",
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
    """Queue `event` for every org hook of the repository's owner that subscribes to it. The
    payload is rendered now, as Gitea's PrepareWebhooks stores it when the change is made."""
    r = GiteaRenderer(forge)
    for inst in forge.state.installations_for_repo(repo):
        app = forge.state.apps.get(inst.app_id)
        if app is None or not is_org_hook(app) or not subscribed(app, event, action):
            continue
        payload: dict[str, Any] = {"action": action} if action is not None else {}
        payload.update(body)
        payload["repository"] = r.repo(repo)
        payload["sender"] = r.anonymous_user(sender)  # ToUser(doer, nil)
        forge.webhooks.enqueue(app, event, action, payload, inst.id, repo.id)


def issue_event(forge: LocalForge, action: str, repo: Repo, sender: str, issue: Any,
                changes: dict[str, Any] | None = None) -> None:
    r = GiteaRenderer(forge, viewer=sender)  # ToAPIIssue(ctx, doer, issue)
    body: dict[str, Any] = {"number": issue.number}
    if changes:
        body["changes"] = changes
    body["issue"] = r.issue(repo, issue)
    body["commit_id"] = ""
    emit(forge, "issues", action, repo, sender, body)


def comment_event(forge: LocalForge, action: str, repo: Repo, sender: str, issue: Any,
                  comment: dict[str, Any], changes: dict[str, Any] | None = None) -> None:
    """IssueCommentPayload: `pull_request` is omitempty, so plain issues have no such key."""
    r = GiteaRenderer(forge, viewer=sender)
    body: dict[str, Any] = {"issue": r.issue(repo, issue), "comment": comment}
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
        "pusher": r.anonymous_user(pusher)})


def repo_created(forge: LocalForge, repo: Repo, sender: str) -> None:
    r = GiteaRenderer(forge)
    emit(forge, "repository", "created", repo, sender,
         {"organization": r.anonymous_user(repo.owner)})


def account_renamed(forge: LocalForge, account: Account, was: str, sender: str) -> None:
    """Gitea tells no hook of an org renamed: whoever cares reads its orgs again."""


def repo_renamed(forge: LocalForge, repo: Repo, was: str, sender: str) -> None:
    """Gitea sends no webhook for a repository renamed either."""


def repo_transferred(forge: LocalForge, repo: Repo, was: str, sender: str) -> None:
    """Nor for one transferred to another owner."""


def delivery_headers(forge: LocalForge, app: App, delivery: Delivery,
                     body: bytes) -> dict[str, str]:
    """deliver.go addDefaultHeaders: without a secret both signatures are empty strings, so
    X-Gitea-Signature is sent empty and X-Hub-Signature(-256) as the bare `sha1=`/`sha256=`."""
    kind = hook_type(delivery.event, delivery.action)
    sig = sig1_hex = ""
    if app.webhook_secret:
        key = app.webhook_secret.encode()
        sig = hmac.new(key, body, hashlib.sha256).hexdigest()
        sig1_hex = hmac.new(key, body, hashlib.sha1).hexdigest()
    sig256, sig1 = "sha256=" + sig, "sha1=" + sig1_hex
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
