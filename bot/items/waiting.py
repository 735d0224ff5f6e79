"""Waiting made visible where people look (issue 25): an outcome whose open questions wait on
someone is shown in the forge's own view as blocked by a "Waiting on <who>" tracking issue, and
stops being once the questions are answered (or resolved).

Chosen per office (`waiting:` in the office config):

* ``none`` (the default): nothing is written to the forge. It is the least noise: an org that
  wants the forge to show it opts in, and one tracking issue a person appears in its issue
  list once it does.
* ``dependency``: GitHub's issue dependencies. One tracking issue a person a repository,
  "Waiting on <login>", opened by the app the first time an outcome there waits on them and
  reused after that (bot.store.waiting keeps which it is); the outcome is "blocked by" it while
  one of its questions waits on them unanswered. The tracker's own "blocking" list is then what
  waits on that person. Its text mentions nobody, so it notifies nobody.
* ``field``: GitHub's issue fields, for an org where tracking issues are too much noise. The
  outcome's "Waiting on" field (a text field of the org: names are open-ended, a single-select
  would need an option a person) says who its unanswered questions wait on ("marco, rita"),
  and is cleared once they are answered. The field is the org's: the app looks it up by name
  (one read, ETag-cached) and, if it is missing, tries to create it; GitHub lets only "an
  administrator for the organization" create issue fields (classic tokens `admin:org`,
  fine-grained the organisation's "Issue Fields" write), which an installation of vaultmail's
  App is not asking for, so an org that wants `waiting: field` creates it once: `vaultmail
  office setup-types --org ORG --office vaultmail.yml` with an owner's token (it makes the
  issue types and, for `waiting: field`, this field), or Settings > Planning > Issue fields.
  Until it exists the app writes nothing and ledgers one `office.config_refused` saying so;
  a forge without issue fields (Gitea, Forgejo) gets the same one line.

The outcome is the question's scope: a question on a plan or evidence waits for the outcome it
is under, where the item is in the outcome's repository. Whoever may read the outcome on the
forge reads what it shows: a question on an item in another repository, which some of them
may not see, is not shown there (its card still waits in the inbox of whom it asks).
`sync` compares who the scope's unanswered questions wait on with the trackers the
outcome is blocked by (one read, ETag-cached; a tracker is known by the app's hidden marker in
its text, so one the index lost is still removed; two questions at once open one tracker,
`bot.forge.once.issue_once`, closing a second that lands late) and adds or removes the
difference, so running it again changes nothing. A tracker someone removed by
hand while the question still waits is put back at once (the `issue_dependencies` webhook
`blocked_by_removed`: handlers.items.blocker_removed): what waits stops waiting when it is
answered or resolved, not when the link is cut; a blocker of the people's own is left alone.
Sync runs again when the outcome is closed or reopened (a closed outcome waits on nobody:
handlers.items.item_changed).
Gitea and Forgejo have dependencies too ("depends on"): the same, through their API.
"""

from __future__ import annotations

import hashlib
import logging
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from bot.forge import markers
from bot.forge.errors import (
    ForgeError,
    NotFound,
    PermissionDenied,
    PutOff,
    Unauthorized,
    ValidationFailed,
)
from bot.forge.once import issue_once
from bot.office.source import CONFIG_REPO
from bot.office.visibility import login_of
from bot.store import comments as db
from bot.store import ledger
from bot.store import waiting as store

if TYPE_CHECKING:
    from bot.app.services import Services
    from bot.forge.base import Forge
    from bot.office.config import Office


class Comments(Protocol):
    """What waiting needs of `bot.items.service.Comments` (which calls it: no import back)."""

    services: Services
    forge: Forge
    office: Office

log = logging.getLogger(__name__)


@runtime_checkable
class Dependencies(Protocol):
    """A forge with GitHub's issue dependencies."""

    async def list_blocked_by(self, repo: str, number: int) -> list[dict[str, Any]]: ...

    async def add_blocked_by(self, repo: str, number: int, issue_id: int,
                             by_repo: str = "", by_number: int = 0) -> bool: ...

    async def remove_blocked_by(self, repo: str, number: int, issue_id: int,
                                by_repo: str = "", by_number: int = 0) -> bool: ...


@runtime_checkable
class IssueFields(Protocol):
    """A forge with GitHub's issue fields."""

    async def list_issue_fields(self, org: str) -> list[dict[str, Any]]: ...

    async def create_issue_field(self, org: str, name: str, data_type: str,
                                 description: str | None = None) -> dict[str, Any]: ...

    async def list_issue_field_values(self, repo: str, number: int) -> list[dict[str, Any]]: ...

    async def set_issue_field_value(self, repo: str, number: int, field_id: int,
                                    value: str | float) -> None: ...

    async def delete_issue_field_value(self, repo: str, number: int, field_id: int) -> bool: ...


FIELD = "Waiting on"  # the org's issue field `waiting: field` writes
FIELD_DESCRIPTION = ("Who this outcome's open questions wait on (vaultmail); cleared once "
                     "they are answered")


def marker(org: str, principal: str) -> str:
    """The hidden line that names a tracker's principal without showing it (an email is not
    written into a repository's issues)."""
    token = hashlib.sha256(f"{org.lower()}\0{principal}".encode()).hexdigest()[:20]
    return markers.marker("waiting-on", token)


def shown_name(service: Comments, principal: str) -> str:
    return login_of(service.office, principal) or principal.partition(":")[2] or principal


async def sync(service: Comments, scope: str) -> None:
    """Make the forge show who the outcome `scope` waits on; never raises for the forge (the
    comment that called it is already recorded): a failure is logged and the next question
    or answer on the outcome puts it right."""
    mode = service.office.waiting
    if mode == "none":
        return
    forge = service.forge
    try:
        if mode == "field":
            await _sync_field(service, scope)
        elif isinstance(forge, Dependencies):
            await _sync(service, forge, scope)
    except PutOff:
        raise  # (waiting for the forge's budget: the delivery is put off and shows it then)
    except ForgeError as exc:
        log.warning("waiting: could not show who %s waits on: %s", scope, exc)


async def _sync(service: Comments, forge: Dependencies, scope: str) -> None:
    st = service.services.store
    outcome = await db.get_item(st, scope)
    if outcome is None or outcome.kind != "outcome":
        return
    want = await store.waiting_on(st, scope, outcome.repo)
    if outcome.state == "closed":
        want = set()
    known = {t.principal: t for t in await store.trackers(st, outcome.repo)}
    # the outcome's blockers that are trackers, by their marker (not by the index alone: a
    # tracker two replicas both opened, or one the index lost, is still recognised)
    office = service.office
    principals = want | set(known) | {h.principal for h in office.humans} \
        | {a.principal for a in office.agents}
    marks = {marker(office.org, p): p for p in principals}
    shown: dict[str, list[store.Tracker]] = {}
    for issue in await forge.list_blocked_by(outcome.repo, outcome.number):
        body = str(issue.get("body") or "")
        p = next((who for mark, who in marks.items() if markers.carries(body, mark)), None)
        by = str((issue.get("user") or {}).get("login") or "")
        if p is not None and by.lower() == service.services.bot_login.lower():
            repo = _repo_of(issue) or outcome.repo
            shown.setdefault(p, []).append(
                store.Tracker(repo, p, int(issue["number"]), int(issue["id"])))
    for principal in sorted(want - set(shown)):
        tracker = await _tracker(service, outcome.repo, principal, known.get(principal))
        try:
            await _block(forge, outcome.repo, outcome.number, tracker)
        except NotFound:  # the tracker was deleted or moved: a new one
            tracker = await _tracker(service, outcome.repo, principal, None)
            await _block(forge, outcome.repo, outcome.number, tracker)
    for principal, trackers in sorted(shown.items()):
        for t in trackers if principal not in want else trackers[1:]:
            await forge.remove_blocked_by(outcome.repo, outcome.number, t.issue_id, t.repo,
                                          t.number)


def _repo_of(issue: dict[str, Any]) -> str | None:
    url = str(issue.get("repository_url") or "")
    at = url.rfind("/repos/")
    return url[at + len("/repos/"):].lower() if at >= 0 else None


async def _block(forge: Dependencies, repo: str, number: int, t: store.Tracker) -> None:
    await forge.add_blocked_by(repo, number, t.issue_id, t.repo, t.number)


async def _tracker(service: Comments, repo: str, principal: str,
                   known: store.Tracker | None) -> store.Tracker:
    """The open tracker for `principal` in `repo`: the one the index knows (reopened if someone
    closed it, since a closed issue blocks nothing), else the app's open one carrying its
    marker, else a new one (`issue_once`: a second opened at the same time is closed)."""
    forge = service.forge
    if known is not None:
        try:
            issue = await forge.get_issue(repo, known.number)
        except NotFound:
            issue = None
        if issue is not None and int(issue["id"]) == known.issue_id:
            if issue.get("state") == "closed":
                await forge.update_issue(repo, known.number, state="open")
            return known
    name = shown_name(service, principal)
    mark = marker(service.office.org, principal)
    body = (f"Outcomes blocked by this issue have questions that wait on {name} to answer "
            "them. vaultmail keeps it: each outcome stops being blocked by it once its "
            "questions are answered. The issue itself needs nothing done; leave it open.\n\n"
            f"{mark}")
    # opened once, however many questions on the repository's outcomes wait on them at once
    issue = await issue_once(forge, repo, f"Waiting on {name}", body, mark)
    tracker = store.Tracker(repo.lower(), principal, int(issue["number"]), int(issue["id"]))
    async with service.services.store.transaction() as tx:
        await store.put(tx, tracker)
    return tracker


# -- waiting: field --------------------------------------------------------------------------
async def _sync_field(service: Comments, scope: str) -> None:
    st = service.services.store
    outcome = await db.get_item(st, scope)
    if outcome is None or outcome.kind != "outcome":
        return
    forge = service.forge
    if not isinstance(forge, IssueFields):
        await _refuse(service, "this forge has no issue fields (GitHub's); use `waiting: "
                               "dependency` or `none`")
        return
    field = await _field(service, forge)
    if field is None:
        return
    want = (set() if outcome.state == "closed"
            else await store.waiting_on(st, scope, outcome.repo))
    value = ", ".join(sorted({shown_name(service, p) for p in want}, key=str.lower))
    issue = await forge.get_issue(outcome.repo, outcome.number)  # ETag-cached
    values = issue.get("issue_field_values")
    if not isinstance(values, list):  # a REST issue without them: ask for them
        values = await forge.list_issue_field_values(outcome.repo, outcome.number)
    current = next((v.get("value") for v in values
                    if isinstance(v, dict) and v.get("issue_field_id") == field), None)
    if value and value != current:
        await forge.set_issue_field_value(outcome.repo, outcome.number, field, value)
    elif not value and current is not None:
        await forge.delete_issue_field_value(outcome.repo, outcome.number, field)


async def _field(service: Comments, forge: IssueFields) -> int | None:
    """The id of the org's "Waiting on" text field, made if missing and the app may; else None,
    with the refusal ledgered (once)."""
    org = service.office.org
    try:
        listed = await forge.list_issue_fields(org)
    except (PermissionDenied, Unauthorized):
        await _refuse(service, "the forge does not let the app read the organisation's issue "
                               "fields (GitHub: the organisation's \"Issue Fields\" read "
                               "permission for the App)")
        return None
    found = next((f for f in listed if str(f.get("name", "")).lower() == FIELD.lower()), None)
    if found is None:
        try:
            found = await forge.create_issue_field(org, FIELD, "text", FIELD_DESCRIPTION)
        except (PermissionDenied, Unauthorized, NotFound, ValidationFailed):
            await _refuse(service, f'the organisation has no "{FIELD}" issue field and the '
                                   "app may not create one (GitHub asks an organisation "
                                   "administrator): run `vaultmail office setup-types --org "
                                   f"{org} --office vaultmail.yml` with an owner's token, or "
                                   f'create a text field "{FIELD}" in Settings > Planning > '
                                   "Issue fields")
            return None
    if found.get("data_type") != "text":
        await _refuse(service, f'the organisation\'s "{FIELD}" issue field is a '
                               f"{found.get('data_type')} field: it must be a text field")
        return None
    return int(found["id"])


async def _refuse(service: Comments, why: str) -> None:
    """`waiting: field` cannot be done: one line in the ledger as a refused config entry, once
    an office (the next question on an outcome would say it again)."""
    org = service.office.org
    where = service.services.offices.where(org)
    await ledger.record_once(service.services.store, "office.config_refused", "office",
                             f"{org}/{CONFIG_REPO}",
                             {"errors": [f"{where}: waiting: field: {why}"],
                              "waiting": "field"}, org=org, by=("waiting",))
