"""The Gitea/Forgejo implementation of the Forge interface.

Gitea has no Apps: the app is a bot user with a personal access token (sent as
``Authorization: token``, which gidgethub already speaks), its webhooks come from an org hook,
and there is one "installation" (a synthetic id) for everything the token can reach.

The request loop is GitHub's (:class:`bot.forge.github.RepoCaller`): writes serialised and paced,
5xx/timeouts retried with backoff for reads and idempotent writes, a create never retried blind
(looked up by its marker after an ambiguous failure), 429 + ``Retry-After`` from a proxy waited
out, ETags used if the forge sends them (Gitea mostly does not). What differs, and is translated
here so handlers keep seeing GitHub-shaped dicts:

* the API lives under ``/api/v1``; pages are ``page`` + ``limit`` (at most 50), ``Link`` rel=next;
* labels are addressed by **id**: names are resolved through a per-repository cache (refreshed
  on a miss; a name still unknown is created, as GitHub auto-creates unknown labels);
* ``PATCH .../issues/{index}`` takes no labels: a label change is a ``PUT .../labels`` with ids
  first, then the PATCH (whose answer carries the new labels) when other fields change too;
* ``GET .../issues/{index}/comments`` is not paged; ``labels=`` on issue lists is AND (though
  Gitea's swagger says "any"), but a name Gitea does not know is silently dropped from the
  filter (none left: no filter at all), so the AND is checked here again;
* the collaborator permission ``owner`` is ``admin``; there is no ``repository_dispatch``, no
  issue search and no webhook delivery log (reconciliation finds nothing to redeliver);
* the mail state labels are Gitea's exclusive scoped labels ``mail/new`` … ``mail/held``, so the
  forge itself keeps one state on an issue (adding one removes the others of its scope). The
  app's core keeps its names (``mail:new``): names are mapped here, out on every write and in on
  every read (the old ``mail:new`` spelling still reads as itself), and a vault's old labels are
  renamed in place, by id, the first time its labels are listed (:func:`migrate_labels`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import aiohttp
from uritemplate import variable

from labels.catalogue import MAIL_LABELS, Label

from . import markers
from .base import (
    JSON,
    Forge,
    StateChange,
    blob_sha,
    contents_route,
    probe,
)
from .caller import (
    _NO_BODY,
    ForgeConfig,
    Policy,
    RepoCaller,
    RequestStats,
    SharedBudget,
    UrlVars,
    _iso,
    _iso_epoch,
    split_repo,
)
from .clock import Clock, SystemClock
from .errors import ForgeError, MovedAway, NotFound, OwnerChanged
from .pacing import Sleep

log = logging.getLogger("vaultmail.forge.gitea")

SYNTHETIC_INSTALLATION_ID = 1  # the one "installation" a Gitea bot has
PAGE = 50  # Gitea's MAX_RESPONSE_ITEMS default
REPO_ROUTE = "/repos/{owner}/{repo}"  # every route of one repository begins so
EDIT_FIELDS = frozenset({"title", "body", "state", "assignees", "milestone"})
KNOWN_FIELDS = EDIT_FIELDS | {"labels", "state_reason"}
# the mail states' Gitea names (one exclusive scope, `mail/`) from the app's, and back: both
# spellings read as the app's name, so an issue still labelled `mail:new` reads as before
_OUT = {label.name.lower(): "mail/" + label.name.split(":", 1)[1] for label in MAIL_LABELS}
_IN = {**{v: k for k, v in _OUT.items()}, **{k: k for k in _OUT}}


def gitea_name(name: str) -> str:
    """The label's name in a Gitea vault: a mail state `mail:new` is `mail/new`."""
    return _OUT.get(name.lower(), name)


def core_name(name: str) -> str:
    """The app's name for a Gitea label: `mail/new` (any case) and `mail:new` are `mail:new`."""
    return _IN.get(name.lower(), name)


def _gitea_label(label: Label) -> Label:
    """A catalogue label as a Gitea vault carries it (the state names in its text too)."""
    text = label.description
    for core, out in _OUT.items():
        text = text.replace(core, out)
    return Label(gitea_name(label.name), label.color, text)


CATALOGUE = {gitea_name(label.name).lower(): _gitea_label(label) for label in MAIL_LABELS}


def api_base(url: str) -> str:
    url = url.rstrip("/")
    return url if url.endswith("/api/v1") else url + "/api/v1"


def github_issue(issue: JSON) -> JSON:
    """Gitea's issue as the GitHub-shaped dict handlers read (only what differs is touched)."""
    out = dict(issue)
    if not out.get("pull_request"):
        out.pop("pull_request", None)  # GitHub marks pull requests by the key's presence
    out["assignees"] = out.get("assignees") or []
    out["body"] = out.get("body") or ""
    out["labels"] = [github_label(lb) for lb in out.get("labels") or []]
    return out


def github_label(label: JSON) -> JSON:
    """Gitea's label as the app reads it: GitHub's colour, the app's name for a mail state."""
    return {**label, "name": core_name(str(label.get("name", ""))),
            "color": str(label.get("color", "")).lstrip("#")}


def migrations(labels: Sequence[JSON]) -> list[tuple[JSON, str]]:
    """The old-style state labels (`mail:new`) to rename in place, with their new names: a
    rename keeps the label's id, so every issue keeps its label and no issue is touched. One
    whose new name is taken already (a replica of the previous release made it again during a
    rolling deploy, or a person did) is left as it is: it still reads as its state, and the
    app's next label write on such an issue replaces it. Only a label spelled exactly as the
    app made it is renamed, one per state (the oldest): a person's own `MAIL:NEW` beside it
    keeps its name, colour and scope."""
    taken = {str(lb.get("name", "")).lower() for lb in labels}
    out: list[tuple[JSON, str]] = []
    for lb in sorted(labels, key=lambda lb: int(lb.get("id", 0))):
        name = str(lb.get("name", ""))
        if name in _OUT and _OUT[name] not in taken:
            out.append((lb, _OUT[name]))
            taken.add(_OUT[name])
    return out


class GiteaForge(RepoCaller):
    """The Forge interface for the bot user's token."""

    client: GiteaClient

    def __init__(self, client: GiteaClient, installation_id: int,
                 org: str | None = None, account: int | None = None) -> None:
        self.installation_id = int(installation_id)
        super().__init__(client, self.installation_id)
        self.org = org  # whose writes these are: each org's paced and budgeted apart
        # the forge's id of the account whose office this forge works for (`org`'s when the
        # office was resolved): its repositories are written only while they are that
        # account's, whatever the index holds for the login by the time a write's turn comes
        self.account = account
        if org is not None:
            self._log_extra["org"] = org
        self._labels: dict[str, dict[str, int]] = {}  # repo -> lower name -> id

    @property
    def _budget_key(self) -> str:
        """One bot serves every org: each org draws on a budget of its own, as each GitHub
        installation does (else one office's burst spent every office's hour)."""
        return f"gitea:{self.org}" if self.org is not None else "gitea"

    async def _credentials(self) -> dict[str, str]:
        return {"oauth_token": self.client.token}

    def _invalidate(self, credentials: Mapping[str, str]) -> None:
        """Gitea tokens do not expire: a 401 is retried once, then Unauthorized."""

    def _by_app(self, item: Mapping[str, Any]) -> bool:
        user = item.get("user") or {}
        return str(user.get("login", "")).lower() == self.client.bot_login.lower()

    # -- whose a repository is -------------------------------------------------------------------
    # Gitea names a repository by its owner's login alone, and tells no hook of an org renamed:
    # until the app's next look at the bot's orgs (bot.app.gitea_orgs) the index holds an
    # office's vaults under a login another account may have taken meanwhile, with a
    # repository of the same name. One bot token reaches both: so each write into a repository,
    # and each read of a file (the office's config, its vaults' files: the office's own
    # words), first reads whose the repository is now.

    async def _before_write(self, url: str, url_vars: UrlVars | None) -> None:
        if url.startswith(REPO_ROUTE) and url_vars is not None:
            await self._owner_checked(str(url_vars["owner"]), str(url_vars["repo"]))

    async def owner_confirmed(self, repo: str) -> None:
        """(base.Forge.owner_confirmed) Issue and comment reads are not checked (one GET
        more each): what they found is confirmed this way only where the office would hold
        it against its mail for good (a mail that does not verify: flagged, ledgered)."""
        await self._owner_checked(*repo.split("/", 1))

    async def _file(self, repo: str, path: str, ref: str | None = None,
                    at_most: int | None = None) -> JSON | None:
        await self._owner_checked(*repo.split("/", 1))
        return await super()._file(repo, path, ref, at_most)

    async def _request(self, method: str, url: str, url_vars: UrlVars | None = None,
                       data: Any = _NO_BODY, *, policy: Policy | None = None,
                       content: bool = False,
                       find_existing: Callable[[], Awaitable[Any]] | None = None,
                       read_at_most: int | None = None) -> tuple[Any, str | None, int]:
        try:
            return await super()._request(method, url, url_vars, data, policy=policy,
                                          content=content, find_existing=find_existing,
                                          read_at_most=read_at_most)
        except MovedAway as exc:  # (Gitea leads an org's old login to its new one)
            if url.startswith(REPO_ROUTE) and url_vars is not None:
                await self._renamed_checked(str(url_vars["owner"]), exc)
            raise

    async def _owner_checked(self, owner: str, name: str) -> None:
        """Nothing when `owner/name` is the account's the index holds for `owner` (or the
        index holds none, or the repository is not found: the request itself then says
        so); else OwnerChanged (`_changed`)."""
        held = await self._held(owner)
        if held is None:
            return
        repo = f"{owner}/{name}"
        now = await self._owner_id(repo)  # (led to its org's new login: OwnerChanged, `_request`)
        if now is not None and now != held:
            await self._changed(repo, held, now, (
                f"it is another account's now (id {now}), not the org's its office was "
                f"made for (id {held}): that org renamed itself, or left the name, and "
                "another took it"))

    async def _renamed_checked(self, owner: str, moved: MovedAway) -> None:
        """A request into a repository of `owner` that the forge leads to `moved.now`:
        OwnerChanged (`_changed`) when that one is the account's the index holds for
        `owner` (the org renamed itself, unheard); else nothing (it went to another
        owner: `MovedAway` says so)."""
        held = await self._held(owner)
        if held is None:
            return
        if await self._owner_id(moved.now) == held:
            await self._changed(moved.was, held, held,
                                f"its org renamed itself ({moved.now} now)")

    async def _owner_id(self, repo: str) -> int | None:
        """The forge's id of `repo`'s owner now; None when the repository is not found."""
        try:
            data = await self._get(REPO_ROUTE, split_repo(repo))
        except NotFound:
            return None
        now = (data.get("owner") or {}).get("id") if isinstance(data, dict) else None
        return now if isinstance(now, int) else None

    async def _held(self, owner: str) -> int | None:
        """The account a repository of `owner` must be: this forge's office's (`account`),
        never the one the index holds for the login by the time of the check (a look at the
        bot's orgs may have moved the login to another account's office meanwhile, while
        this write waited for its turn). A forge of no office's (the bot's own calls), or
        of an office whose account was not known: the index's, as it is now."""
        if self.account is not None and owner.lower() == self.org:
            return self.account
        account_of = self.client.account_of
        return None if account_of is None else await account_of(owner)

    async def _changed(self, repo: str, held: int, now: int, why: str) -> None:
        """`repo`'s login is not the account's the index holds for it (`why`): the app
        looks at the bot's orgs (`owner_changed`), then OwnerChanged."""
        log.warning("a repository's login is not the account's the index holds for it: "
                    "nothing of it written or read as the office's; the bot's orgs looked at "
                    "again", extra={**self._log_extra, "repo": repo, "why": why,
                                    "account_id": held, "owner_id": now})
        if self.client.owner_changed is not None:
            await self.client.owner_changed()
        raise OwnerChanged(
            f"{repo}: {why}; nothing was written there, and the app has looked at the bot's "
            "orgs again so the office follows its org: try again", repo=repo, held=held,
            now=now, url=REPO_ROUTE.format(owner=repo.partition("/")[0],
                                           repo=repo.partition("/")[2]))

    # -- labels by id --------------------------------------------------------------------------
    async def _repo_labels(self, repo: str) -> list[JSON]:
        """The vault's labels as Gitea names them, old-style state labels renamed first."""
        labels = [lb async for lb in self._paginate(
            "/repos/{owner}/{repo}/labels{?limit}", {**split_repo(repo), "limit": PAGE})]
        labels = await self.migrate_labels(repo, labels)
        self._labels[repo.lower()] = {str(lb["name"]).lower(): int(lb["id"]) for lb in labels}
        return labels

    async def migrate_labels(self, repo: str, labels: list[JSON]) -> list[JSON]:
        """Rename the vault's `mail:new`-style labels to `mail/new`, exclusive, by id. Safe
        across replicas: each PATCH sets absolute values on one id, so two replicas renaming
        the same label both leave it the same; one deleted meanwhile is skipped."""
        renamed: dict[int, JSON] = {}
        for label, name in migrations(labels):
            want = CATALOGUE[name]
            try:
                data, _, _ = await self._request(
                    "PATCH", "/repos/{owner}/{repo}/labels/{id}",
                    {**split_repo(repo), "id": int(label["id"])},
                    {"name": want.name, "exclusive": True, "color": "#" + want.color,
                     "description": want.description})
            except NotFound:
                continue
            renamed[int(label["id"])] = data if isinstance(data, dict) else {**label,
                                                                               "name": name}
        if renamed:
            log.info("mail labels renamed to Gitea's exclusive scope in %s: %s", repo,
                     sorted(str(lb["name"]) for lb in renamed.values()),
                     extra={**self._log_extra, "repo": repo})
        return [renamed.get(int(lb["id"]), lb) for lb in labels]

    async def _label_ids(self, repo: str, names: Sequence[str], create: bool = True) -> list[int]:
        """Ids for label names (the app's names, mapped to Gitea's), from the cache; a miss
        refreshes it once, and a name still unknown is created (from the catalogue when it is
        one of ours)."""
        key = repo.lower()
        names = [gitea_name(n) for n in names]
        wanted = [n.lower() for n in names]
        if key not in self._labels or any(n not in self._labels[key] for n in wanted):
            await self._repo_labels(repo)
        ids: list[int] = []
        for name in names:
            known = self._labels[key].get(name.lower())
            if known is None:
                if not create:
                    continue
                spec = CATALOGUE.get(name.lower(), Label(name, "ededed", ""))
                made = await self._create_label(repo, spec, name)
                known = self._labels[key][name.lower()] = int(made["id"])
            if known not in ids:
                ids.append(known)
        return ids

    async def _create_label(self, repo: str, want: Label, name: str | None = None) -> JSON:
        data: JSON
        data, _, _ = await self._request(
            "POST", "/repos/{owner}/{repo}/labels", split_repo(repo),
            {"name": name or want.name, "color": "#" + want.color,
             "description": want.description, "exclusive": _exclusive(name or want.name)})
        return data

    # -- issues ----------------------------------------------------------------------------------
    async def get_issue(self, repo: str, number: int) -> JSON:
        data = await self._get("/repos/{owner}/{repo}/issues/{number}",
                               {**split_repo(repo), "number": number})
        return github_issue(data)

    async def create_issue(self, repo: str, title: str, body: str, labels: Sequence[str] = (),
                           marker: str | None = None,
                           accept: Callable[[JSON], bool] | None = None) -> JSON:
        if marker is not None and marker not in body:
            raise ValueError("marker must be contained in the body")
        payload: JSON = {"title": title, "body": body}
        if labels:
            payload["labels"] = await self._label_ids(repo, labels)
        find = None
        if marker is not None:

            async def find() -> JSON | None:
                return await self.find_issue(repo, marker, accept)

        data, _, _ = await self._request(
            "POST", "/repos/{owner}/{repo}/issues", split_repo(repo), payload,
            policy="create", content=True, find_existing=find)
        return github_issue(data)

    async def find_issue(self, repo: str, marker: str,
                         accept: Callable[[JSON], bool] | None = None) -> JSON | None:
        since = _iso_epoch(self.client.clock.now() - self.config.marker_window)
        async for issue in self._paginate(
            "/repos/{owner}/{repo}/issues{?state,type,since,limit}",
            {**split_repo(repo), "state": "all", "type": "issues", "since": since,
             "limit": PAGE},
            max_pages=self.config.marker_search_pages,
        ):
            if self._by_app(issue) and markers.found_in(issue.get("body") or "", marker) and (
                    accept is None or accept(github_issue(issue))):
                return github_issue(issue)
        return None

    async def update_issue(self, repo: str, number: int, **fields: Any) -> JSON:
        unknown = set(fields) - KNOWN_FIELDS
        if unknown:
            raise TypeError(f"update_issue: unknown fields {sorted(unknown)}")
        fields.pop("state_reason", None)  # Gitea has no close reason
        rv: dict[str, variable.VariableValue] = {**split_repo(repo), "number": number}
        if "labels" in fields:
            await self.set_labels(repo, number, list(fields.pop("labels")))
        edit = {k: v for k, v in fields.items() if k in EDIT_FIELDS}
        if not edit:
            return await self.get_issue(repo, number)
        data, _, _ = await self._request("PATCH", "/repos/{owner}/{repo}/issues/{number}",
                                         rv, edit)
        return github_issue(data)

    async def iter_issues(self, repo: str, state: str = "all",
                          labels: Sequence[str] | None = None,
                          since: str | datetime | None = None) -> AsyncIterator[JSON]:
        url_vars: dict[str, variable.VariableValue] = {
            **split_repo(repo), "state": state, "type": "issues", "limit": PAGE}
        if labels:
            url_vars["labels"] = ",".join(gitea_name(n) for n in labels)
        since_s = _iso(since)
        if since_s:
            url_vars["since"] = since_s
        wanted = {core_name(n).lower() for n in labels or ()}
        async for issue in self._paginate(
                "/repos/{owner}/{repo}/issues{?state,type,labels,since,limit}", url_vars):
            have = {core_name(str(lb.get("name", ""))).lower()
                    for lb in issue.get("labels") or []}
            # Gitea drops unknown names from labels=: an issue may lack one of them
            if issue.get("pull_request") or not wanted <= have:
                continue
            yield github_issue(issue)

    async def timeline(self, repo: str, number: int) -> list[JSON]:
        """The issue's timeline, oldest first: its comments and what was done to it (`type`
        close, reopen, label; `user` who did it; a label's `body` "1" when added)."""
        return [entry async for entry in self._paginate(
            "/repos/{owner}/{repo}/issues/{number}/timeline{?limit}",
            {**split_repo(repo), "number": number, "limit": PAGE})]

    async def label_changes(self, repo: str, number: int, label: str) -> list[tuple[str, bool]]:
        """Who changed `label` on the issue and whether they added it, oldest first (its
        timeline's `label` entries, body "1" when added; logins in lower case)."""
        name = label.lower()
        return [(str((e.get("user") or {}).get("login", "")).lower(), e.get("body") == "1")
                for e in await self.timeline(repo, number)
                if e.get("type") == "label"
                and str((e.get("label") or {}).get("name", "")).lower() == name]

    async def state_changes(self, repo: str, number: int) -> list[StateChange]:
        """Each close, reopen and label change of the issue, oldest first (its timeline's
        `close`, `reopen` and `label` entries, a label's body "1" when added; a mail state
        label by the app's name)."""
        events = {"close": "closed", "reopen": "reopened"}
        return [StateChange(
            events.get(str(e["type"])) or ("labeled" if e.get("body") == "1" else "unlabeled"),
            str((e.get("user") or {}).get("login", "")).lower(), e.get("created_at"),
            str(github_label(e.get("label") or {})["name"]) if e["type"] == "label" else "")
            for e in await self.timeline(repo, number)
            if e.get("type") in ("close", "reopen", "label")]

    # -- dependencies (issue 25): Gitea's "depends on", GitHub's "blocked by" ---------------------
    async def list_blocked_by(self, repo: str, number: int) -> list[JSON]:
        """The issues this one depends on (is blocked by), in GitHub's shape."""
        return [github_issue(issue) async for issue in self._paginate(
            "/repos/{owner}/{repo}/issues/{number}/dependencies{?limit}",
            {**split_repo(repo), "number": number, "limit": PAGE})]

    async def add_blocked_by(self, repo: str, number: int, issue_id: int,
                             by_repo: str = "", by_number: int = 0) -> bool:
        """Make the issue depend on `by_repo`#`by_number` (Gitea names the other issue by
        repository and index; `issue_id` is GitHub's way). Gitea answers a dependency already
        there with a 500: the caller lists first, and this is not retried (a 5xx raises)."""
        owner, name = by_repo.split("/", 1)
        await self._request(
            "POST", "/repos/{owner}/{repo}/issues/{number}/dependencies",
            {**split_repo(repo), "number": number},
            {"owner": owner, "repo": name, "index": by_number}, policy="once")
        return True

    async def remove_blocked_by(self, repo: str, number: int, issue_id: int,
                                by_repo: str = "", by_number: int = 0) -> bool:
        owner, name = by_repo.split("/", 1)
        try:
            await self._request(
                "DELETE", "/repos/{owner}/{repo}/issues/{number}/dependencies",
                {**split_repo(repo), "number": number},
                {"owner": owner, "repo": name, "index": by_number}, policy="once")
        except NotFound:
            return False
        return True

    # -- pull requests and commit statuses (issue 23: a config change checked before merging) ----

    async def pull_files(self, repo: str, number: int) -> list[JSON]:
        """The files a pull request changes (Gitea's ChangedFile: `filename`, `status`)."""
        return [
            entry
            async for entry in self._paginate(
                "/repos/{owner}/{repo}/pulls/{number}/files{?limit}",
                {**split_repo(repo), "number": number, "limit": PAGE},
            )
        ]

    async def report_check(self, repo: str, head_sha: str, name: str, ok: bool, title: str,
                           summary: str, annotations: Sequence[JSON] = ()) -> JSON:
        """Gitea has no check runs: a commit status (`context` the check's name, state success
        or failure), its description the title and the first annotation's message and place
        (Gitea keeps 255 characters; a status has no room for the summary)."""
        first = ""
        if annotations:
            note = annotations[0]
            column = f", column {note['start_column']}" if note.get("start_column") else ""
            first = f": {note['message']} (line {note['start_line']}{column})"
        data, _, _ = await self._request(
            "POST", "/repos/{owner}/{repo}/statuses/{sha}", {**split_repo(repo), "sha": head_sha},
            {"state": "success" if ok else "failure", "context": name,
             "description": (title + first)[:255]},
            policy="idempotent")
        status: JSON = data if isinstance(data, dict) else {}
        return status

    async def search_issues(self, q: str) -> list[JSON]:
        raise ForgeError("issue search is not used on Gitea; list a repository's issues",
                         method="GET", url="/repos/issues/search")

    # -- labels ----------------------------------------------------------------------------------
    async def add_labels(self, repo: str, number: int, labels: Sequence[str]) -> list[JSON]:
        if not labels:
            return list((await self.get_issue(repo, number)).get("labels", []))
        data, _, _ = await self._request(
            "POST", "/repos/{owner}/{repo}/issues/{number}/labels",
            {**split_repo(repo), "number": number},
            {"labels": await self._label_ids(repo, labels)}, policy="idempotent")
        return list(github_issue({"labels": data or []})["labels"])

    async def remove_label(self, repo: str, number: int, name: str) -> bool:
        """Gitea answers 204 whether or not the label was there: look first (a free read).
        A state is removed in both spellings (`mail/new` and an old `mail:new`)."""
        issue = await self.get_issue(repo, number)
        on = [lb for lb in issue.get("labels", [])
              if str(lb.get("name", "")).lower() == core_name(name).lower()]
        removed = False
        for label in on:
            try:
                await self._request(
                    "DELETE", "/repos/{owner}/{repo}/issues/{number}/labels/{id}",
                    {**split_repo(repo), "number": number, "id": int(label["id"])})
            except NotFound:
                continue
            removed = True
        return removed

    async def set_labels(self, repo: str, number: int, labels: Sequence[str]) -> list[JSON]:
        data, _, _ = await self._request(
            "PUT", "/repos/{owner}/{repo}/issues/{number}/labels",
            {**split_repo(repo), "number": number},
            {"labels": await self._label_ids(repo, labels)})
        return list(github_issue({"labels": data or []})["labels"])

    async def ensure_labels(self, repo: str, labels: Sequence[Label]) -> dict[str, list[str]]:
        """The labels made or corrected, by their Gitea names (a state label exclusive)."""
        existing = {str(lb.get("name", "")).lower(): lb for lb in await self._repo_labels(repo)}
        created: list[str] = []
        updated: list[str] = []
        for want in (CATALOGUE.get(gitea_name(lb.name).lower(), lb) for lb in labels):
            have = existing.get(want.name.lower())
            if have is None:
                made = await self._create_label(repo, want)
                self._labels[repo.lower()][want.name.lower()] = int(made["id"])
                created.append(want.name)
                continue
            exclusive = _exclusive(want.name)
            if (str(have.get("name")) != want.name
                    or str(have.get("color", "")).lstrip("#").lower() != want.color.lower()
                    or (have.get("description") or "") != want.description
                    or bool(have.get("exclusive")) != exclusive):
                await self._request(
                    "PATCH", "/repos/{owner}/{repo}/labels/{id}",
                    {**split_repo(repo), "id": int(have["id"])},
                    {"name": want.name, "color": "#" + want.color,
                     "description": want.description, "exclusive": exclusive})
                updated.append(want.name)
        if created or updated:
            log.info("labels ensured in %s: created %s, updated %s", repo, created, updated,
                     extra={**self._log_extra, "repo": repo})
        return {"created": created, "updated": updated}

    # -- comments --------------------------------------------------------------------------------

    async def list_comments(self, repo: str, number: int,
                            since: str | datetime | None = None) -> list[JSON]:
        """One request: Gitea returns every comment of an issue at once (no paging)."""
        url_vars: dict[str, variable.VariableValue] = {**split_repo(repo), "number": number}
        since_s = _iso(since)
        if since_s:
            url_vars["since"] = since_s
        data = await self._get("/repos/{owner}/{repo}/issues/{number}/comments{?since}",
                               url_vars)
        return list(data or [])

    # -- repository ------------------------------------------------------------------------------
    async def permission(self, repo: str, login: str) -> str:
        try:
            data = await self._get(
                "/repos/{owner}/{repo}/collaborators/{username}/permission",
                {**split_repo(repo), "username": login})
        except NotFound:
            return "none"
        role = str(data.get("permission") or data.get("role_name") or "none")
        return "admin" if role == "owner" else role

    async def put_file(self, repo: str, path: str, content: bytes, message: str,
                       sha: str | None = None) -> JSON:
        """Gitea creates with POST and replaces with PUT (the `sha` required)."""
        import base64

        payload: JSON = {"message": message, "content": base64.b64encode(content).decode()}
        if sha is not None:
            payload["sha"] = sha
        want = blob_sha(content)

        async def find() -> JSON | None:
            info = await self.file_info(repo, path)
            return {"content": info} if info is not None and info.get("sha") == want else None

        data, _, _ = await self._request(
            "POST" if sha is None else "PUT", contents_route(path),
            split_repo(repo), payload, policy="create", content=True, find_existing=find)
        result: JSON = dict(data.get("content") or {}) if isinstance(data, dict) else {}
        return result

    async def dispatch(self, repo: str, event_type: str,
                       client_payload: Mapping[str, Any]) -> None:
        raise ForgeError("Gitea has no repository_dispatch: use `dispatch: <webhook URL>` for "
                         "this agent's runs", method="POST", url=f"/repos/{repo}/dispatches")

    async def list_installation_repos(self) -> list[str]:
        """Every repository of the bot's organisations."""
        repos: list[str] = []
        async for org in self._paginate("/user/orgs{?limit}", {"limit": PAGE}):
            login = org.get("username") or org.get("name")
            async for r in self._paginate("/orgs/{org}/repos{?limit}",
                                          {"org": login, "limit": PAGE}):
                repos.append(str(r["full_name"]))
        return repos

    async def user_orgs(self) -> list[str]:
        return list(await self.user_org_ids())

    async def user_org_ids(self) -> dict[str, int | None]:
        """{org (lower case): its id} of every org the bot is in: whose each name is (an org
        deleted frees its name, and another user may make one of that name)."""
        return {str(o.get("username") or o.get("name")).lower():
                o["id"] if isinstance(o.get("id"), int) else None
                async for o in self._paginate("/user/orgs{?limit}", {"limit": PAGE})}


def _exclusive(name: str) -> bool:
    """Whether a label the app makes is exclusive: its own state labels, and only those."""
    return name.lower() in _IN and "/" in name


def _implements_forge(forge: GiteaForge) -> Forge:
    return forge  # mypy checks GiteaForge against the Forge protocol here


class GiteaHooks:
    """Gitea's REST API has no webhook delivery log (only the web UI replays deliveries), so
    there is nothing for the reconciler to list or redeliver."""

    async def iter_deliveries(self, status: str | None = None,
                              per_page: int = 100) -> AsyncIterator[JSON]:
        return
        yield {}  # an async generator that yields nothing

    async def redeliver(self, delivery_id: int) -> None:
        raise ForgeError("Gitea's API cannot redeliver webhooks", method="POST", url="")


class GiteaClient:
    """The process-wide Gitea client: the bot's one forge (any installation id maps to it)."""

    def __init__(self, token: str, session: aiohttp.ClientSession, url: str,
                 bot_login: str = "", requester: str = "vaultmail", *,
                 config: ForgeConfig | None = None, sleep: Sleep = asyncio.sleep,
                 monotonic: Callable[[], float] = time.monotonic,
                 clock: Clock | None = None) -> None:
        self.token = token
        self.session = session
        self.api_url = api_base(url)
        self.bot_login = bot_login
        self.requester = requester
        self.config = config or ForgeConfig()
        self.shared_budget: SharedBudget | None = None  # set when replicas share a store
        self.sleep = sleep
        self.monotonic = monotonic
        self._clock: Clock = clock if clock is not None else SystemClock()
        self.stats = RequestStats()
        self.semaphore = asyncio.Semaphore(max(1, self.config.max_concurrency))
        # the forge's id of the account the index holds for a login (bot.app.build sets it):
        # a repository of that login's is written, and its files read, only while it is
        # that account's (`GiteaForge._owner_checked`)
        self.account_of: Callable[[str], Awaitable[int | None]] | None = None
        # told of a repository found another account's: the app's look at the bot's orgs
        # (bot.app.gitea_orgs), which the office follows
        self.owner_changed: Callable[[], Awaitable[object]] | None = None
        # by org (lower case) and the account whose office it is: after a takeover the
        # office that had the login and the newcomer's share no forge (its turn, its label ids)
        self._forges: dict[tuple[str | None, int | None], GiteaForge] = {}
        self._hooks = GiteaHooks()

    @property
    def clock(self) -> Clock:
        return self._clock

    def installation(self, installation_id: int | None = None, *, org: str | None = None,
                     account: int | None = None) -> GiteaForge:
        """The bot's forge for `org`'s office, made for `account` (its own pacer and budget;
        its repositories written only while they are that account's), or for no org in
        particular (the bot's own calls: its user, its orgs)."""
        login = org.lower() if org else None
        key = (login, account if login is not None else None)
        forge = self._forges.get(key)
        if forge is None:
            forge = self._forges[key] = GiteaForge(self, SYNTHETIC_INSTALLATION_ID, org=login,
                                                   account=key[1])
        return forge

    async def reachable(self) -> int:
        """The status the forge answers an unauthenticated request with (readiness)."""
        return await probe(self.session, self.api_url + "/version")

    def app(self) -> GiteaHooks:
        return self._hooks

    def forget(self, installation_id: int) -> None:
        self._forges.clear()

    async def whoami(self) -> str:
        """The bot's login (`GET /user`)."""
        data = await self.installation()._get("/user")
        return str(data.get("login") or data.get("username"))


__all__ = ["SYNTHETIC_INSTALLATION_ID", "GiteaClient", "GiteaForge", "GiteaHooks", "api_base",
           "core_name", "gitea_name", "github_issue", "github_label", "migrations"]
