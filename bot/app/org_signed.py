"""Deliveries signed with an org's own webhook secret (Gitea: `POST /webhook/<org>`, the secret
`vaultmail gitea-hook ORG` prints) are the word of that org's admins, who set the webhook and
so know its secret: they could sign a comment marco never wrote, and the app would send mail
signed as his. The forge records who did what, so before the handlers read such a delivery it
is checked against the forge, and what it says is taken from there:

- a comment is read back by its id, on the delivery's issue: its text and author are the
  forge's; one `created` must be the sender's, and is taken once (`org_signed_comments`); one
  `edited` is read in no one's name (the app's own): Gitea records no editor, and an admin may
  edit anyone's comment, so a tick in a question card over such a webhook answers nothing
  (handlers.items.card_edited undoes it). One `deleted` holds where the forge has no such
  comment and the index holds it on that issue: Gitea's comment ids are sequential across
  the instance, so the admins could sign the deletion of a comment not written yet, and its
  tombstone would silence that comment when it came (in no one's name: the forge does not
  say who deleted it). For the same reason a `created` whose comment the
  forge shows edited since it was written (its `updated_at` is not its `created_at`) is read
  in no one's name: its author did not necessarily write what it says now (the handlers
  run none of its commands and note so: handlers.comments.handle_comment);
- an issue is read back (its title, body, state, labels and author are the forge's, and so
  is its repository's name and id: the repository the forge answers the delivery's name
  with, a renamed vault's old name leading to it); one
  `opened` must be the sender's. Every other action the handlers take as the sender's must be
  in the issue's timeline as the sender's (`_TIMELINE`): a close, a reopen (the issue in that
  state), a label change (of the label the delivery names, added or removed as it says), an
  assignee added or removed, a new title (from and to the titles the delivery says). Each
  timeline row is taken by one delivery (`org_signed_rows`), so one change is never taken
  twice, while a delivery about an earlier act of another kind (redelivered, or out of order)
  still takes its own row. The newest row not taken yet that shows the act is taken, with the
  sender's rows of its kind before it: the handlers read the issue as it is now (its labels,
  its state), and one of Gitea's label deliveries may stand for several rows. An event, or a
  comment's `created`, older than the retention (VAULTMAIL_RETENTION_DAYS: what records it
  was taken is pruned after that) is taken by no delivery: a delivery comes within seconds,
  not days. A body edit is in no timeline (Gitea records no editor): it is read as the forge
  has the body, in no one's name (the app's own). Any other action is refused;
- a push is read in no one's name (the app's own): its handler reads the config it pushed
  from the forge, and Gitea keeps no record of who pushed that the app can read back;
- an event Gitea never sends (a repository renamed or transferred, a sub-issue or a dependency
  linked: GitHub's) is refused: its handler would follow a rename that never was, or record a
  link in the sender's name;
- anything else needs a sender who may write to the repository.

What does not hold is refused (`NotAsTheForgeSays`): the delivery acts on nothing. Deliveries
signed with the operator's secret (a GitHub App's, Gitea's system webhook) are the forge's own
and are read as they come."""

from __future__ import annotations

import copy
import time
from collections.abc import Container
from typing import TYPE_CHECKING, Any

from gidgethub import sansio

from bot.forge.errors import NotFound
from bot.forge.gitea import GiteaForge, github_label
from bot.forge.gitea_events import github_user
from bot.items.model import make_ref
from bot.mail.signing import former_offices
from bot.store import comments, deliveries
from bot.store.moves import edited_since_written, forge_time
from bot.store.prune import DAY
from bot.store.queue import issue_key

if TYPE_CHECKING:
    from bot.app.context import HandlerContext
    from bot.store import Store

# what of an issue is taken from the forge
_ISSUE_FIELDS = ("title", "body", "state", "labels", "user", "closed_at", "updated_at",
                 "assignees")
# the `issues` actions the handlers take as the sender's besides `opened`, each with the type
# of the timeline row (Gitea's comment types, models/issues/comment.go) that shows who did it
_TIMELINE = {"closed": "close", "reopened": "reopen", "labeled": "label", "unlabeled": "label",
             "assigned": "assignees", "unassigned": "assignees", "edited": "change_title"}
_WRITERS = ("write", "maintain", "admin")
# the events Gitea sends of those the handlers read (a `repository` only `created` or
# `deleted`: no rename, no transfer): any other over an org's webhook is its admins' word alone
_GITEA_SENDS = ("issues", "issue_comment", "push", "pull_request", "repository")
_REPOSITORY_ACTIONS = ("created", "deleted")


class NotAsTheForgeSays(Exception):
    """An org-signed delivery says what the forge does not: refused."""


def org_signed(delivery_id: str) -> bool:
    """Whether a queued delivery came through an org's own webhook (its id is recorded as
    `<org>/<id>`, bot.app.intake)."""
    return "/" in delivery_id


def _login(user: Any) -> str:
    if not isinstance(user, dict):
        return ""
    return str(user.get("login") or user.get("username") or "").lower()


async def _may_write(forge: GiteaForge, repo: str, login: str) -> bool:
    return await forge.permission(repo, login) in _WRITERS


async def as_the_forge_has_it(forge: GiteaForge, event: str, data: dict[str, Any],
                              bot_login: str, *, taken: Container[int] = (),
                              since: float = 0.0) -> tuple[dict[str, Any], list[int]]:
    """The delivery's payload with its issue and comment as the forge has them, and the
    timeline rows it is taken on (none of `taken`, those other deliveries took; none made
    before `since`); raises NotAsTheForgeSays when the sender did not do what it says (see the
    module)."""
    out = copy.deepcopy(data)
    sender = _login(out.get("sender"))
    if isinstance(out.get("sender"), dict):  # its id is the forge's only where read from it
        out["sender"].pop("id", None)
    if isinstance(out.get("repository"), dict):  # checked by name: its id is the signer's
        out["repository"].pop("id", None)  # word (handlers.common.repo_now follows ids; the
        # forge's is put in from what it answers: `_answered`)
    repo = (out.get("repository") or {}).get("full_name")
    action = out.get("action")
    if not sender or not isinstance(repo, str):
        raise NotAsTheForgeSays("it names no sender or no repository")
    if event not in _GITEA_SENDS or (event == "repository" and action not in _REPOSITORY_ACTIONS):
        raise NotAsTheForgeSays(f"Gitea sends no {event} {action or ''}: its org's admins "
                                "alone said it")
    issue = out.get("issue")
    if event == "push":  # its handler reads what it acts on (the office config) from the forge;
        # who pushed, Gitea keeps no record of that the app can read back: no one's (the app's)
        out["sender"] = github_user({"login": bot_login}, bot_login)
        return out, []
    if not isinstance(issue, dict):
        if not await _may_write(forge, repo, sender):
            raise NotAsTheForgeSays(f"{sender} may not write to {repo}")
        return out, []
    number = int(issue["number"])
    try:
        found = await forge.get_issue(repo, number)
    except NotFound:
        raise NotAsTheForgeSays(f"{repo}#{number} does not exist") from None
    found["user"] = github_user(found.get("user"), bot_login)
    out["issue"] = {**issue, **{k: found[k] for k in _ISSUE_FIELDS if k in found}}
    repo = _answered(found, out, repo)
    author = _login(found.get("user"))
    if event == "issue_comment":
        await _comment(forge, repo, number, out, sender, bot_login, since)
    elif event == "issues" and action == "opened":
        if author != sender:
            raise NotAsTheForgeSays(f"{repo}#{number} was opened by {author}, not {sender}")
        out["sender"] = found["user"]
    elif event == "issues" and action == "edited" and "title" not in (out.get("changes") or {}):
        out["sender"] = github_user({"login": bot_login}, bot_login)  # (see the module)
    elif event == "issues" and action in _TIMELINE:
        if action in ("closed", "reopened") and found.get("state") != (
                "closed" if action == "closed" else "open"):
            raise NotAsTheForgeSays(f"{repo}#{number} is not {action}")
        free = [e for e in await forge.timeline(repo, number)
                if int(e.get("id") or 0) not in taken and _login(e.get("user")) == sender
                and (forge_time(e.get("created_at")) or 0.0) >= since]
        done = [e for e in free if _shows(str(action), data, e)]
        if not done:
            raise NotAsTheForgeSays(f"{repo}#{number}'s timeline shows no {action} by {sender} "
                                    "that was not taken already")
        out["sender"] = github_user(done[-1].get("user"), bot_login)
        newest = int(done[-1]["id"])
        return out, [int(e["id"]) for e in free
                     if e.get("type") == _TIMELINE[str(action)] and int(e["id"]) <= newest]
    elif event == "issues":
        raise NotAsTheForgeSays(f"an org-signed {action} is not read")
    elif author != sender and not await _may_write(forge, repo, sender):
        raise NotAsTheForgeSays(f"{sender} may not write to {repo}")
    return out, []


def _answered(found: dict[str, Any], out: dict[str, Any], repo: str) -> str:
    """The full name of the repository the forge answered the delivery's `repo` with (a
    renamed repository's old name leads to it, within its owner), read back with the issue
    with the app's own token: `out` names it so, its id the forge's; `repo` where the forge
    named none."""
    answered = found.get("repository")
    if not isinstance(answered, dict) or not isinstance(answered.get("id"), int) or \
            not isinstance(answered.get("full_name"), str):
        return repo
    out["repository"].update({k: answered[k] for k in ("id", "name", "full_name")
                              if k in answered})
    return str(answered["full_name"])


def _shows(action: str, out: dict[str, Any], entry: dict[str, Any]) -> bool:
    """Whether a timeline row is what an `issues` delivery `out` (as it came) says was done."""
    if entry.get("type") != _TIMELINE[action]:
        return False
    if _TIMELINE[action] == "change_title":  # (else any unused rename of the sender's would do)
        was = (out.get("changes") or {}).get("title")
        return isinstance(was, dict) and entry.get("old_title") == was.get("from") and \
            entry.get("new_title") == (out.get("issue") or {}).get("title")
    if _TIMELINE[action] == "label":
        added = entry.get("body") == "1"
        # Gitea's own label_updated / label_cleared name no label, and add or remove any
        if "gitea_action" not in out and added != (action == "labeled"):
            return False
        named = out.get("label")
        return not isinstance(named, dict) or str(named.get("name", "")).lower() == str(
            github_label(entry.get("label") or {})["name"]).lower()
    if _TIMELINE[action] == "assignees":
        named = _login(out.get("assignee"))
        return bool(entry.get("removed_assignee")) == (action == "unassigned") and (
            not named or named == _login(entry.get("assignee")))
    return True


async def _comment(forge: GiteaForge, repo: str, number: int, out: dict[str, Any],
                   sender: str, bot_login: str, since: float) -> None:
    if out.get("action") not in ("created", "edited", "deleted"):  # what the handlers read
        raise NotAsTheForgeSays(f"an org-signed comment {out.get('action')} is not read")
    comment = out.get("comment")
    if not isinstance(comment, dict) or not isinstance(comment.get("id"), int):
        raise NotAsTheForgeSays("it names no comment")
    if out.get("action") == "deleted":  # it holds where the forge has no such comment; by
        # whom, the forge does not say: in no one's name
        try:
            await forge.get_comment(repo, int(comment["id"]))
        except NotFound:
            out["sender"] = github_user({"login": bot_login}, bot_login)
            return
        raise NotAsTheForgeSays(f"comment {comment['id']} is still on {repo}")
    try:
        found = await forge.get_comment(repo, int(comment["id"]))
    except NotFound:
        raise NotAsTheForgeSays(f"comment {comment['id']} does not exist on {repo}") from None
    # (Gitea gives a pull request's comment no issue_url: its address is pull_request_url)
    where = {str(found.get(k) or "").lower() for k in ("issue_url", "pull_request_url")}
    if not any(w.endswith((f"/{repo.lower()}/issues/{number}", f"/{repo.lower()}/pulls/{number}"))
               for w in where):
        raise NotAsTheForgeSays(f"comment {comment['id']} is not on {repo}#{number}")
    author = _login(found.get("user"))
    written = forge_time(found.get("created_at"))
    if out.get("action") == "created":
        if (written or 0.0) < since:
            raise NotAsTheForgeSays(f"comment {comment['id']} was written before the retention "
                                    "(what says its `created` was taken is pruned by then)")
        if author != sender:
            raise NotAsTheForgeSays(f"comment {comment['id']} was written by {author}, not "
                                    f"{sender}")
        out["sender"] = github_user(found.get("user"), bot_login)
    # an edit (since it was written, for a `created`): by whom, the forge does not say (see
    # the module). Gitea stamps both to the second: an edit within it goes unseen
    if out.get("action") == "edited" or edited_since_written(found):
        out["sender"] = github_user({"login": bot_login}, bot_login)
    out["comment"] = {**comment, "body": found.get("body") or "",
                      "user": github_user(found.get("user"), bot_login),
                      **{k: found[k] for k in ("created_at", "updated_at") if k in found}}


async def _indexed(store: Store, data: dict[str, Any]) -> bool:
    """Whether the index holds the comment a delivery names, on the issue it names."""
    issue = data.get("issue")
    if not isinstance(issue, dict):
        return False
    return await comments.comment_by_forge_id(store, int(data["comment"]["id"]), make_ref(
        str(data["repository"]["full_name"]), int(issue["number"]))) is not None


def named_now(had: dict[str, str], data: dict[str, Any]) -> dict[str, Any]:
    """`data` naming its repository's owner as the office whose webhook took it is called
    now, where it names a login the office had (`had`: its names before): sent before its org
    renamed itself (redelivered as it was, or queued then), and the forge leads no old login
    to the new one (bot.forge.caller refuses a repository moved to another owner)."""
    repo = data.get("repository")
    if not isinstance(repo, dict) or not isinstance(repo.get("full_name"), str):
        return data
    owner, _, name = repo["full_name"].lower().partition("/")
    if owner not in former_offices(had):
        return data
    return {**data, "repository": {**repo, "full_name": f"{had[owner]}/{name}"}}


async def checked_event(ctx: HandlerContext, event: sansio.Event) -> sansio.Event:
    """`event` as the forge has it (`as_the_forge_has_it`), for the handlers; the timeline
    event or the new comment it was taken on is recorded, so no other delivery is taken on
    it."""
    if not isinstance(ctx.forge, GiteaForge):  # (intake takes org webhooks on Gitea alone)
        raise NotAsTheForgeSays("only Gitea's org webhooks are signed by an org")
    store, guid = ctx.services.store, str(event.delivery_id)
    named = named_now(ctx.services.keyring.renamed(guid.split("/", 1)[0]), event.data)
    key = issue_key(named)
    since = time.time() - ctx.services.settings.retention_days * DAY  # (bot.store.prune)
    data, rows = await as_the_forge_has_it(
        ctx.forge, event.event, named, ctx.services.bot_login,
        taken=await deliveries.org_signed_taken(store, key, guid) if key else (), since=since)
    if key and rows and not await deliveries.org_signed_took(store, key, rows, guid):
        raise NotAsTheForgeSays(f"timeline row {rows[-1]} of {key} was taken already, by "
                                "another delivery at the same moment")
    if event.event == "issue_comment" and data.get("action") == "deleted" and \
            not await _indexed(store, data):
        # the forge has no such comment: maybe not yet (Gitea's ids are sequential). A
        # tombstone would drop its `created` when it comes; none is needed, as a `created`
        # over this webhook is read back from the forge, and refused once the comment is gone
        raise NotAsTheForgeSays(f"comment {data['comment']['id']} is none the app indexed "
                                f"on {key}: its deletion takes nothing")
    if event.event == "issue_comment" and data.get("action") == "created" and \
            not await deliveries.org_signed_comment(store, guid.split("/", 1)[0],
                                                    int(data["comment"]["id"]), guid):
        # (the handlers' own once per change keys on the delivery's word for its update time)
        raise NotAsTheForgeSays(f"comment {data['comment']['id']}'s `created` was taken "
                                "already, from another delivery")
    return sansio.Event(data, event=event.event, delivery_id=event.delivery_id)
