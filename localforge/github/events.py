"""Webhook events as GitHub sends them to an App: one delivery per installation covering the
repository whose app subscribes to the event (installation events always go)."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import TYPE_CHECKING, Any

from ..clock import iso
from ..state import Account, App, Delivery, Installation, Repo
from .render import Renderer, node_id

if TYPE_CHECKING:
    from ..forge import LocalForge

ALWAYS = {"installation", "installation_repositories", "installation_target"}
HOOKSHOT = "GitHub-Hookshot/" + secrets.token_hex(4)[:7]


def subscribed(app: App, event: str) -> bool:
    return event in ALWAYS or event in app.events or "*" in app.events


def emit(forge: LocalForge, event: str, action: str | None, repo: Repo, sender: str,
         body: dict[str, Any]) -> None:
    """Queue `event` for every installation covering `repo`. `body` holds the event's own
    objects (issue, comment, label, changes ...), placed after `action` as GitHub orders them."""
    r = Renderer(forge)
    for inst in forge.state.installations_for_repo(repo):
        app = forge.state.apps.get(inst.app_id)
        if app is None or not subscribed(app, event) or inst.suspended_at is not None:
            continue
        payload: dict[str, Any] = {"action": action} if action is not None else {}
        payload.update(_webhook_shape(body))
        if event == "issue_comment" and isinstance(payload.get("issue"), dict):
            # the issue_comment webhooks' issue has no issue_field_values (the issues ones do)
            payload["issue"].pop("issue_field_values", None)
        payload["repository"] = r.repo_hook(repo)
        if forge.state.org(repo.owner) is not None:
            payload["organization"] = r.org_simple(repo.owner)
        payload["sender"] = r.user(sender)
        payload["installation"] = {"id": inst.id, "node_id": node_id("Installation", inst.id)}
        forge.webhooks.enqueue(app, event, action, payload, inst.id, repo.id)


# Webhook issue/comment objects differ from the REST ones: these REST-only fields are in
# neither the official webhooks description nor any real payload, and real issue payloads
# carry "draft": false (tests/conformance compares both).
_REST_ONLY = {"issue": ("closed_by", "pinned_comment", "parent_issue_url"),
              "comment": ("minimized", "pin")}


def _webhook_shape(body: dict[str, Any]) -> dict[str, Any]:
    out = dict(body)
    for key, drop in _REST_ONLY.items():
        if isinstance(out.get(key), dict):
            out[key] = {k: v for k, v in out[key].items() if k not in drop}
            via = out[key].get("performed_via_github_app")
            if isinstance(via, dict):  # the webhooks description's App has no client_id
                out[key]["performed_via_github_app"] = {
                    k: v for k, v in via.items() if k != "client_id"}
    if isinstance(out.get("issue"), dict) and "pull_request" not in out["issue"]:
        out["issue"].setdefault("draft", False)
    return out


def pushed(forge: LocalForge, repo: Repo, pusher: str, path: str, existed: bool) -> None:
    """A one-file commit pushed to the default branch (how config files change on GitHub)."""
    before, after = secrets.token_hex(20), repo.head_sha or secrets.token_hex(20)
    user = forge.state.account(pusher)
    who = {"name": pusher, "email": getattr(user, "email", None) or f"{pusher}@users.noreply"}
    commit = {"id": after, "tree_id": secrets.token_hex(20), "distinct": True,
              "message": f"Update {path}", "timestamp": iso(forge.clock.now()),
              "url": f"{forge.url}/{repo.full_name}/commit/{after}", "author": who,
              "committer": who, "added": [] if existed else [path],
              "removed": [], "modified": [path] if existed else []}
    emit(forge, "push", None, repo, pusher, {
        "ref": f"refs/heads/{repo.default_branch}", "before": before, "after": after,
        "created": False, "deleted": False, "forced": False, "base_ref": None,
        "compare": f"{forge.url}/{repo.full_name}/compare/{before[:12]}...{after[:12]}",
        "commits": [commit], "head_commit": commit, "pusher": who})


def _repo_brief(repo: Repo) -> dict[str, Any]:
    return {"id": repo.id, "node_id": node_id("Repository", repo.id), "name": repo.name,
            "full_name": repo.full_name, "private": repo.private}


def installation_created(forge: LocalForge, inst: Installation, sender: str) -> None:
    _installation(forge, inst, sender, "created")


def installation_deleted(forge: LocalForge, inst: Installation, sender: str) -> None:
    _installation(forge, inst, sender, "deleted")


def installation_suspended(forge: LocalForge, inst: Installation, sender: str,
                           action: str) -> None:
    """`suspend` or `unsuspend`: the installation events a suspended App still gets."""
    _installation(forge, inst, sender, action)


def _installation(forge: LocalForge, inst: Installation, sender: str, action: str) -> None:
    app = forge.state.apps[inst.app_id]
    r = Renderer(forge)
    payload: dict[str, Any] = {
        "action": action,
        "installation": r.installation(inst),
        "repositories": [_repo_brief(x) for x in forge.state.installation_repos(inst)],
        "requester": None,
        "sender": r.user(sender),
    }
    forge.webhooks.enqueue(app, "installation", action, payload, inst.id, None)


def repo_created(forge: LocalForge, repo: Repo, sender: str) -> None:
    """A new repository under an all-repositories installation: installation_repositories."""
    r = Renderer(forge)
    for inst in forge.state.installations_for_repo(repo):
        if inst.repository_selection != "all" or inst.suspended_at is not None:
            continue
        app = forge.state.apps[inst.app_id]
        payload: dict[str, Any] = {
            "action": "added",
            "installation": r.installation(inst),
            "repository_selection": "all",
            "repositories_added": [_repo_brief(repo)],
            "repositories_removed": [],
            "requester": None,
            "sender": r.user(sender),
        }
        forge.webhooks.enqueue(app, "installation_repositories", "added", payload, inst.id,
                               None)


def account_renamed(forge: LocalForge, account: Account, was: str, sender: str) -> None:
    """The user or org an App is installed on renamed itself: `installation_target.renamed`
    to each of its installations (the same installation and account id, a new login)."""
    r = Renderer(forge)
    for inst in list(forge.state.installations.values()):
        if inst.account.lower() != account.login.lower():
            continue
        payload: dict[str, Any] = {
            "action": "renamed",
            "account": r.user(account.login),
            "changes": {"login": {"from": was}},
            "installation": {"id": inst.id, "node_id": node_id("Installation", inst.id)},
            "sender": r.user(sender),
            "target_type": account.type,
        }
        forge.webhooks.enqueue(forge.state.apps[inst.app_id], "installation_target",
                               "renamed", payload, inst.id, None)


def repo_renamed(forge: LocalForge, repo: Repo, was: str, sender: str) -> None:
    """`repository.renamed`, with the name it had (`changes.repository.name.from`)."""
    emit(forge, "repository", "renamed", repo, sender,
         {"changes": {"repository": {"name": {"from": was}}}})


def repo_transferred(forge: LocalForge, repo: Repo, was: str, sender: str) -> None:
    """`repository.transferred`, sent only to the account it went to (GitHub's docs), with
    the owner it had (`changes.owner.from.organization`, or `.user`)."""
    r = Renderer(forge)
    acct = forge.state.account(was)
    before = ({"organization": r.org_simple(was)} if acct is not None
              and acct.type == "Organization" else {"user": r.user(was)})
    emit(forge, "repository", "transferred", repo, sender,
         {"changes": {"owner": {"from": before}}})


def delivery_headers(forge: LocalForge, app: App, delivery: Delivery,
                     body: bytes) -> dict[str, str]:
    headers = {
        "Accept": "*/*",
        "Content-Type": "application/json",
        "User-Agent": HOOKSHOT,
        "X-GitHub-Delivery": delivery.guid,
        "X-GitHub-Event": delivery.event,
        "X-GitHub-Hook-ID": str(app.hook_id),
        "X-GitHub-Hook-Installation-Target-ID": str(app.id),
        "X-GitHub-Hook-Installation-Target-Type": "integration",
    }
    if app.webhook_secret:
        key = app.webhook_secret.encode()
        headers["X-Hub-Signature"] = "sha1=" + hmac.new(key, body, hashlib.sha1).hexdigest()
        headers["X-Hub-Signature-256"] = ("sha256=" +
                                          hmac.new(key, body, hashlib.sha256).hexdigest())
    return headers
