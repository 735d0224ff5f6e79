"""Issue and label mutations shared by routes: each records its timeline event and queues the
webhooks GitHub sends (one `labeled` / `unlabeled` per label changed)."""

from __future__ import annotations

import re
from typing import Any

from ..state import Event, Issue, Label, Repo
from .events import emit
from .http import Ctx, invalid

COLOR = re.compile(r"^[0-9a-fA-F]{6}$")


def label_names(raw: Any) -> list[str]:
    """Names from GitHub's accepted forms: ["a", "b"], [{"name": "a"}], or {"labels": [...]}."""
    if isinstance(raw, dict):
        raw = raw.get("labels", [])
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list):
        raise invalid("Label", "labels")
    names: list[str] = []
    for item in raw:
        name = item.get("name") if isinstance(item, dict) else item
        if not isinstance(name, str | int) or str(name).strip() == "":
            raise invalid("Label", "name", "missing_field")
        if str(name) not in names:
            names.append(str(name))
    return names


def normalise_color(value: Any, default: str | None = None) -> str:
    if value is None and default is not None:
        return default
    color = str(value or "").removeprefix("#")
    if not COLOR.match(color):
        raise invalid("Label", "color")
    return color.lower()


def ensure_label(ctx: Ctx, repo: Repo, name: str) -> Label:
    """The repository's label called `name`, auto-created (ededed, no description) if new."""
    label = repo.label_named(name)
    if label is None:
        label = Label(id=ctx.forge.state.next_id("label"), name=name, color="ededed",
                      description=None)
        repo.labels.append(label)
        emit(ctx.forge, "label", "created", repo, ctx.sender,
             {"label": ctx.r.label(repo, label)})
    return label


def record(ctx: Ctx, issue: Issue, kind: str, **extra: Any) -> None:
    issue.events.append(Event(id=ctx.forge.state.next_id("event"), event=kind,
                              actor=ctx.sender, created_at=ctx.forge.clock.now(),
                              via_app=ctx.principal.via_app, **extra))


def touch(ctx: Ctx, repo: Repo, issue: Issue) -> None:
    issue.updated_at = ctx.forge.clock.now()
    repo.updated_at = issue.updated_at


def _apply_add(ctx: Ctx, repo: Repo, issue: Issue, names: list[str]) -> list[Label]:
    added: list[Label] = []
    for name in names:
        label = ensure_label(ctx, repo, name)
        if label.id not in issue.labels:
            issue.labels.append(label.id)
            added.append(label)
    return added


def _apply_remove(issue: Issue, labels: list[Label]) -> list[Label]:
    removed = [lb for lb in labels if lb.id in issue.labels]
    gone = {lb.id for lb in removed}
    issue.labels = [lid for lid in issue.labels if lid not in gone]
    return removed


def emit_label_changes(ctx: Ctx, repo: Repo, issue: Issue, added: list[Label],
                       removed: list[Label]) -> None:
    """The change lands at once; then one event per label, each carrying the full (final)
    `issue.labels` and that single `label`, as GitHub sends them."""
    if not added and not removed:
        return
    touch(ctx, repo, issue)
    rendered = ctx.r.issue(repo, issue)
    for kind, labels in (("unlabeled", removed), ("labeled", added)):
        for label in labels:
            record(ctx, issue, kind, label={"name": label.name, "color": label.color})
            emit(ctx.forge, "issues", kind, repo, ctx.sender,
                 {"issue": rendered, "label": ctx.r.label(repo, label)})


def add_labels(ctx: Ctx, repo: Repo, issue: Issue, names: list[str]) -> list[Label]:
    added = _apply_add(ctx, repo, issue, names)
    emit_label_changes(ctx, repo, issue, added, [])
    return added


def remove_labels(ctx: Ctx, repo: Repo, issue: Issue, labels: list[Label]) -> None:
    emit_label_changes(ctx, repo, issue, [], _apply_remove(issue, labels))


def set_labels(ctx: Ctx, repo: Repo, issue: Issue, names: list[str]) -> None:
    wanted = [ensure_label(ctx, repo, n) for n in names]
    wanted_ids = {lb.id for lb in wanted}
    gone = [lb for lid in issue.labels
            if lid not in wanted_ids and (lb := repo.label_by_id(lid)) is not None]
    removed = _apply_remove(issue, gone)
    added = _apply_add(ctx, repo, issue, [lb.name for lb in wanted])
    emit_label_changes(ctx, repo, issue, added, removed)


def set_assignees(ctx: Ctx, repo: Repo, issue: Issue, logins: list[str]) -> None:
    st = ctx.forge.state
    wanted = []
    for login in logins:
        acct = st.account(login)
        if acct is not None and acct.login not in wanted:
            wanted.append(acct.login)
    for login in [a for a in issue.assignees if a not in wanted]:
        issue.assignees.remove(login)
        record(ctx, issue, "unassigned", assignee=login)
        emit(ctx.forge, "issues", "unassigned", repo, ctx.sender,
             {"issue": ctx.r.issue(repo, issue), "assignee": ctx.r.user(login)})
    for login in [a for a in wanted if a not in issue.assignees]:
        issue.assignees.append(login)
        record(ctx, issue, "assigned", assignee=login)
        emit(ctx.forge, "issues", "assigned", repo, ctx.sender,
             {"issue": ctx.r.issue(repo, issue), "assignee": ctx.r.user(login)})


def close(ctx: Ctx, repo: Repo, issue: Issue, reason: str | None) -> None:
    now = ctx.forge.clock.now()
    issue.state, issue.closed_at, issue.closed_by = "closed", now, ctx.sender
    issue.state_reason = reason or "completed"
    touch(ctx, repo, issue)
    record(ctx, issue, "closed", state_reason=issue.state_reason)
    emit(ctx.forge, "issues", "closed", repo, ctx.sender, {"issue": ctx.r.issue(repo, issue)})


def reopen(ctx: Ctx, repo: Repo, issue: Issue) -> None:
    issue.state, issue.closed_at, issue.closed_by = "open", None, None
    issue.state_reason = "reopened"
    touch(ctx, repo, issue)
    record(ctx, issue, "reopened", state_reason="reopened")
    emit(ctx.forge, "issues", "reopened", repo, ctx.sender, {"issue": ctx.r.issue(repo, issue)})


def renamed(ctx: Ctx, issue: Issue, old: str, new: str) -> None:
    record(ctx, issue, "renamed", rename={"from": old, "to": new})
