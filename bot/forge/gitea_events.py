"""Gitea/Forgejo webhooks as the GitHub-shaped events the handlers already understand.

The one place that knows how Gitea's deliveries differ (forge-facts §2.1, §2.2, §6):

* headers: ``X-Gitea-Delivery`` / ``X-Gitea-Event`` / ``X-Gitea-Signature`` (bare hex
  HMAC-SHA256 of the body; Forgejo sends the same as ``X-Forgejo-*``);
* no ``installation``: a synthetic one (:data:`SYNTHETIC_INSTALLATION_ID`) is added, so the worker
  acts through the bot's one forge;
* ``label_updated`` / ``label_cleared`` (the whole label list, no ``label``) become ``labeled``:
  the handlers re-read the issue's labels anyway. Gitea sends one for every label call, even
  one that changed nothing, and one after ``opened`` when an issue is created with labels;
  an edit of title and body is two ``edited`` (one ``changes`` each): all are idempotent here;
* ``is_pull`` comments mark their issue as a pull request (a plain issue's comment payload has
  no top-level ``pull_request``); the issue's ``pull_request: null`` is dropped (GitHub marks
  pull requests by the key's presence); ``assignees: null`` becomes ``[]``;
* users carry Gitea's no-reply placeholder email in payloads (senders are rendered with no
  viewer) and ``active: false``: neither is read;
* the bot is a plain user: its own events are recognised by its login, and users get the
  ``type`` GitHub gives them (``Bot`` for the bot);
* the mail state labels (Gitea's exclusive scope ``mail/…``) carry the app's names
  (``mail:new``), as every read through :mod:`bot.forge.gitea` does.

Gitea sends no installation events either; :func:`startup_delivery` is the synthetic
``installation.created`` the app queues at start so the labels are provisioned in every vault.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import json
import uuid
from collections.abc import Mapping
from typing import Any

from bot.forge.gitea import SYNTHETIC_INSTALLATION_ID, github_issue, github_label

PREFIXES = ("X-Gitea-", "X-Forgejo-", "X-Gogs-")
LABEL_ACTIONS = {"label_updated", "label_cleared"}


def _header(headers: Mapping[str, str], name: str) -> str:
    for prefix in PREFIXES:
        value = headers.get(prefix + name)
        if value:
            return value
    return ""


def delivery_of(headers: Mapping[str, str]) -> tuple[str, str, str]:
    """(delivery id, event, signature) from Gitea's, Forgejo's or Gogs' headers."""
    return _header(headers, "Delivery"), _header(headers, "Event"), _header(headers, "Signature")


def signature_valid(body: bytes, signature: str, secret: str) -> bool:
    """Gitea's signature: the bare hex HMAC-SHA256 of the raw body (no `sha256=` prefix)."""
    if not signature:
        return False
    expected = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    # (as bytes: the header is the sender's, and a text compare refuses what is not ASCII)
    return hmac.compare_digest(expected.encode(), signature.strip().lower().encode())


def github_user(user: Any, bot_login: str) -> Any:
    if not isinstance(user, dict):
        return user
    out = dict(user)
    out.setdefault("login", out.get("username"))
    is_bot = str(out.get("login", "")).lower() == bot_login.lower()
    out["type"] = "Bot" if is_bot else "User"
    return out


def to_github(event: str, payload: dict[str, Any], bot_login: str) -> dict[str, Any]:
    """The GitHub-shaped payload of a Gitea delivery."""
    out = copy.deepcopy(payload)
    out["installation"] = {"id": SYNTHETIC_INSTALLATION_ID}
    out["sender"] = github_user(out.get("sender"), bot_login)
    if event == "issues" and out.get("action") in LABEL_ACTIONS:
        out["gitea_action"] = out["action"]
        out["action"] = "labeled"
    if isinstance(out.get("issue"), dict):
        issue = github_issue(out["issue"])
        if "number" not in issue and "number" in out:
            issue["number"] = out["number"]
        if out.get("is_pull"):
            issue["pull_request"] = out.get("pull_request") or {}
        issue["user"] = github_user(issue.get("user"), bot_login)
        out["issue"] = issue
    if isinstance(out.get("label"), dict):  # a payload that names one label: the same names
        out["label"] = github_label(out["label"])
    if isinstance(out.get("comment"), dict):
        out["comment"] = {**out["comment"],
                          "user": github_user(out["comment"].get("user"), bot_login)}
    repo = out.get("repository")
    if isinstance(repo, dict) and isinstance(repo.get("owner"), dict):
        owner = repo["owner"]
        repo["owner"] = {**owner, "login": owner.get("login") or owner.get("username")}
    return out


def startup_delivery() -> tuple[str, str, dict[str, Any]]:
    """A synthetic `installation.created` (repositories listed by the handler itself)."""
    payload = {"action": "created", "installation": {"id": SYNTHETIC_INSTALLATION_ID},
               "repositories": []}
    return f"gitea-start-{uuid.uuid4()}", "installation", payload


def encode(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
