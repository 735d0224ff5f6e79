"""The GitHub implementation of the Forge interface, on the shared request loop
(:mod:`bot.forge.caller`).

``ForgeClient`` is built once per process; ``client.installation(id)`` gives the
:class:`GitHubForge` of one installation (cached, so its ETag cache, write lock and pacer
persist), ``client.app()`` the :class:`AppForge` for calls made with the App JWT.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import aiohttp
from uritemplate import variable

from labels.catalogue import Label

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
    ISSUE_FIELDS,
    ForgeConfig,
    RepoCaller,
    RequestStats,
    SharedBudget,
    _Caller,
    _iso,
    _iso_epoch,
    log,
    split_repo,
)
from .clock import Clock
from .errors import (
    NotFound,
    ValidationFailed,
)
from .pacing import Sleep
from .tokens import AppAuth

MAX_ANNOTATIONS = 50  # GitHub's annotations a check-run request


class GitHubForge(RepoCaller):
    """The Forge interface for one installation (an installation token)."""

    client: ForgeClient

    def __init__(self, client: ForgeClient, installation_id: int) -> None:
        self.installation_id = int(installation_id)
        super().__init__(client, self.installation_id)

    async def _credentials(self) -> dict[str, str]:
        return {"oauth_token": await self.client.auth.installation_token(self.installation_id)}

    def _invalidate(self, credentials: Mapping[str, str]) -> None:
        self.client.auth.invalidate(self.installation_id, credentials.get("oauth_token"))

    # -- the ETag cache across processes (so a second `vaultmail reindex` gets 304s) -------------

    def _by_app(self, item: Mapping[str, Any]) -> bool:
        user = item.get("user") or {}
        if self.config.bot_login:
            return str(user.get("login", "")).lower() == self.config.bot_login.lower()
        return bool(user.get("type", "Bot") == "Bot")

    # -- issues ----------------------------------------------------------------------------------

    async def get_issue(self, repo: str, number: int) -> JSON:
        data: JSON = await self._get(
            "/repos/{owner}/{repo}/issues/{number}", {**split_repo(repo), "number": number}
        )
        return data

    async def create_issue(
        self,
        repo: str,
        title: str,
        body: str,
        labels: Sequence[str] = (),
        marker: str | None = None,
        accept: Callable[[JSON], bool] | None = None,
    ) -> JSON:
        if marker is not None and marker not in body:
            raise ValueError("marker must be contained in the body")
        payload: JSON = {"title": title, "body": body}
        if labels:
            payload["labels"] = list(labels)
        find = None
        if marker is not None:

            async def find() -> JSON | None:
                return await self.find_issue(repo, marker, accept)

        data, _, _ = await self._request(
            "POST",
            "/repos/{owner}/{repo}/issues",
            split_repo(repo),
            payload,
            policy="create",
            content=True,
            find_existing=find,
        )
        result: JSON = data
        return result

    async def find_issue(self, repo: str, marker: str,
                         accept: Callable[[JSON], bool] | None = None) -> JSON | None:
        """The newest recent issue by the app whose body contains ``marker``, and that
        ``accept`` takes, if any."""
        since = _iso_epoch(self.client.clock.now() - self.config.marker_window)
        async for issue in self._paginate(
            "/repos/{owner}/{repo}/issues{?state,sort,direction,since,per_page}",
            {
                **split_repo(repo),
                "state": "all",
                "sort": "created",
                "direction": "desc",
                "since": since,
                "per_page": 100,
            },
            max_pages=self.config.marker_search_pages,
        ):
            if "pull_request" in issue or not self._by_app(issue):
                continue
            if markers.found_in(issue.get("body") or "", marker) and (
                    accept is None or accept(issue)):
                found: JSON = issue
                return found
        return None

    async def update_issue(self, repo: str, number: int, **fields: Any) -> JSON:
        unknown = set(fields) - ISSUE_FIELDS
        if unknown:
            raise TypeError(f"update_issue: unknown fields {sorted(unknown)}")
        if "labels" in fields:
            fields["labels"] = list(fields["labels"])
        data: JSON
        data, _, _ = await self._request(
            "PATCH",
            "/repos/{owner}/{repo}/issues/{number}",
            {**split_repo(repo), "number": number},
            fields,
        )
        return data

    async def iter_issues(
        self,
        repo: str,
        state: str = "all",
        labels: Sequence[str] | None = None,
        since: str | datetime | None = None,
    ) -> AsyncIterator[JSON]:
        url_vars: dict[str, variable.VariableValue] = {
            **split_repo(repo),
            "state": state,
            "per_page": 100,
        }
        if labels:
            url_vars["labels"] = ",".join(labels)
        since_s = _iso(since)
        if since_s:
            url_vars["since"] = since_s
        async for issue in self._paginate(
            "/repos/{owner}/{repo}/issues{?state,labels,since,per_page}", url_vars
        ):
            if "pull_request" not in issue:
                yield issue

    # -- the work graph (issue 25): sub-issues and dependencies ----------------------------------

    async def list_sub_issues(self, repo: str, number: int) -> list[JSON]:
        """The issue's sub-issues, in the order people gave them (GitHub allows 100 a parent:
        one page); each a REST issue, which says its repository and its parent."""
        return [
            issue
            async for issue in self._paginate(
                "/repos/{owner}/{repo}/issues/{number}/sub_issues{?per_page}",
                {**split_repo(repo), "number": number, "per_page": 100},
            )
        ]

    async def list_blocked_by(self, repo: str, number: int) -> list[JSON]:
        """The issues this one is blocked by (GitHub's dependencies; 50 at most: one page)."""
        return [
            issue
            async for issue in self._paginate(
                "/repos/{owner}/{repo}/issues/{number}/dependencies/blocked_by{?per_page}",
                {**split_repo(repo), "number": number, "per_page": 100},
            )
        ]

    async def add_blocked_by(self, repo: str, number: int, issue_id: int,
                             by_repo: str = "", by_number: int = 0) -> bool:
        """Mark the issue blocked by the issue with id `issue_id` (GitHub names it by id; Gitea
        by `by_repo` and `by_number`); False when it already was (so a retry after an
        ambiguous failure is no error)."""
        try:
            await self._request(
                "POST",
                "/repos/{owner}/{repo}/issues/{number}/dependencies/blocked_by",
                {**split_repo(repo), "number": number},
                {"issue_id": issue_id},
                policy="idempotent",
                content=True,
            )
        except ValidationFailed:
            if any(int(i.get("id", 0)) == issue_id
                   for i in await self.list_blocked_by(repo, number)):
                return False
            raise
        return True

    async def remove_blocked_by(self, repo: str, number: int, issue_id: int,
                                by_repo: str = "", by_number: int = 0) -> bool:
        """Remove that dependency; False when there was none."""
        try:
            await self._request(
                "DELETE",
                "/repos/{owner}/{repo}/issues/{number}/dependencies/blocked_by/{issue_id}",
                {**split_repo(repo), "number": number, "issue_id": issue_id},
            )
        except NotFound:
            return False
        return True

    # -- issue fields (issue 25, `waiting: field`) ----------------------------------------------

    async def list_issue_fields(self, org: str) -> list[JSON]:
        """The organisation's issue fields (GitHub's `GET /orgs/{org}/issue-fields`)."""
        data = await self._get("/orgs/{org}/issue-fields", {"org": org})
        return [f for f in data if isinstance(f, dict)] if isinstance(data, list) else []

    async def create_issue_field(self, org: str, name: str, data_type: str,
                                 description: str | None = None) -> JSON:
        """A new issue field of the organisation: GitHub asks "an administrator for the
        organization" (an installation without it gets PermissionDenied)."""
        data, _, _ = await self._request(
            "POST", "/orgs/{org}/issue-fields", {"org": org},
            {"name": name, "data_type": data_type, "description": description},
            policy="once", content=True)
        created: JSON = data
        return created

    async def list_issue_field_values(self, repo: str, number: int) -> list[JSON]:
        """The issue's field values (REST issues carry them too, as `issue_field_values`)."""
        return [
            value
            async for value in self._paginate(
                "/repos/{owner}/{repo}/issues/{number}/issue-field-values{?per_page}",
                {**split_repo(repo), "number": number, "per_page": 100},
            )
        ]

    async def set_issue_field_value(self, repo: str, number: int, field_id: int,
                                    value: str | float) -> None:
        """Set (add or update) one issue field's value on the issue, leaving its others."""
        await self._request(
            "POST", "/repos/{owner}/{repo}/issues/{number}/issue-field-values",
            {**split_repo(repo), "number": number},
            {"issue_field_values": [{"field_id": field_id, "value": value}]},
            policy="idempotent", content=True)

    async def delete_issue_field_value(self, repo: str, number: int, field_id: int) -> bool:
        """Clear that field's value on the issue; False when it had none."""
        try:
            await self._request(
                "DELETE",
                "/repos/{owner}/{repo}/issues/{number}/issue-field-values/{field_id}",
                {**split_repo(repo), "number": number, "field_id": field_id})
        except NotFound:
            return False
        return True

    # -- pull requests and checks (issue 23: a config change checked before it is merged) ------

    async def pull_files(self, repo: str, number: int) -> list[JSON]:
        """The files a pull request changes (`filename`, `status`, ...; GitHub lists 3,000 at
        most)."""
        return [
            entry
            async for entry in self._paginate(
                "/repos/{owner}/{repo}/pulls/{number}/files{?per_page}",
                {**split_repo(repo), "number": number, "per_page": 100},
            )
        ]

    async def report_check(self, repo: str, head_sha: str, name: str, ok: bool, title: str,
                           summary: str, annotations: Sequence[JSON] = ()) -> JSON:
        """A completed check run `name` on `head_sha`, success or failure, with its output and
        annotations (`path`, `start_line`, `end_line`, `start_column`, `annotation_level`,
        `message`), in one write: GitHub takes 50 annotations a request and a summary of
        65,535 characters, and the caller gives no more. A retry may leave two runs of the
        name; GitHub shows the newest."""
        if len(annotations) > MAX_ANNOTATIONS:
            raise ValueError(f"{len(annotations)} annotations: a check run takes "
                             f"{MAX_ANNOTATIONS} a request")
        output: JSON = {"title": title, "summary": summary, "annotations": list(annotations)}
        data, _, _ = await self._request(
            "POST", "/repos/{owner}/{repo}/check-runs", split_repo(repo),
            {"name": name, "head_sha": head_sha, "status": "completed",
             "conclusion": "success" if ok else "failure", "output": output},
            policy="idempotent", content=True)
        run: JSON = data
        return run

    async def search_issues(self, q: str) -> list[JSON]:
        return [
            item
            async for item in self._paginate(
                "/search/issues{?q,per_page}",
                {"q": q, "per_page": 100},
                iterable_key="items",
                max_pages=10,
            )
        ]

    # -- labels ----------------------------------------------------------------------------------

    async def add_labels(self, repo: str, number: int, labels: Sequence[str]) -> list[JSON]:
        if not labels:
            return list((await self.get_issue(repo, number)).get("labels", []))
        data, _, _ = await self._request(
            "POST",
            "/repos/{owner}/{repo}/issues/{number}/labels",
            {**split_repo(repo), "number": number},
            {"labels": list(labels)},
            policy="idempotent",  # adding a label twice is adding it once
        )
        return list(data or [])

    async def remove_label(self, repo: str, number: int, name: str) -> bool:
        try:
            await self._request(
                "DELETE",
                "/repos/{owner}/{repo}/issues/{number}/labels/{name}",
                {**split_repo(repo), "number": number, "name": name},
            )
        except NotFound:
            return False
        return True

    async def set_labels(self, repo: str, number: int, labels: Sequence[str]) -> list[JSON]:
        data, _, _ = await self._request(
            "PUT",
            "/repos/{owner}/{repo}/issues/{number}/labels",
            {**split_repo(repo), "number": number},
            {"labels": list(labels)},
        )
        return list(data or [])

    async def ensure_labels(self, repo: str, labels: Sequence[Label]) -> dict[str, list[str]]:
        rv = split_repo(repo)
        existing: dict[str, JSON] = {}
        async for label in self._paginate(
            "/repos/{owner}/{repo}/labels{?per_page}", {**rv, "per_page": 100}
        ):
            existing[str(label.get("name", "")).lower()] = label
        created: list[str] = []
        updated: list[str] = []
        for want in labels:
            have = existing.get(want.name.lower())
            if have is None:
                try:
                    await self._request(
                        "POST",
                        "/repos/{owner}/{repo}/labels",
                        rv,
                        {"name": want.name, "color": want.color, "description": want.description},
                    )
                    created.append(want.name)
                    continue
                except ValidationFailed as exc:
                    # created meanwhile (another worker, or our own retried POST): compare it
                    try:
                        have = await self._get(
                            "/repos/{owner}/{repo}/labels/{name}", {**rv, "name": want.name}
                        )
                    except NotFound:
                        raise exc from None
                    assert have is not None
            if (
                str(have.get("name")) != want.name
                or str(have.get("color", "")).lstrip("#").lower() != want.color.lower()
                or (have.get("description") or "") != want.description
            ):
                await self._request(
                    "PATCH",
                    "/repos/{owner}/{repo}/labels/{name}",
                    {**rv, "name": str(have.get("name", want.name))},
                    {"new_name": want.name, "color": want.color, "description": want.description},
                )
                updated.append(want.name)
        if created or updated:
            log.info(
                "labels ensured in %s: created %s, updated %s",
                repo,
                created,
                updated,
                extra={**self._log_extra, "repo": repo},
            )
        return {"created": created, "updated": updated}

    async def issue_timeline(self, repo: str, number: int) -> list[JSON]:
        """The issue's timeline, oldest first: its events (labeled, closed, ...: each with
        its actor and time) and comments (`vaultmail doctor` reads who changed it last)."""
        return [
            e
            async for e in self._paginate(
                "/repos/{owner}/{repo}/issues/{number}/timeline{?per_page}",
                {**split_repo(repo), "number": number, "per_page": 100},
            )
        ]

    async def label_changes(self, repo: str, number: int, label: str) -> list[tuple[str, bool]]:
        """Who changed `label` on the issue and whether they added it, oldest first (its
        timeline's `labeled`/`unlabeled` events; logins in lower case)."""
        name = label.lower()
        return [(str((e.get("actor") or {}).get("login", "")).lower(), e.get("event") == "labeled")
                for e in await self.issue_timeline(repo, number)
                if e.get("event") in ("labeled", "unlabeled")
                and str((e.get("label") or {}).get("name", "")).lower() == name]

    async def state_changes(self, repo: str, number: int) -> list[StateChange]:
        """Each close, reopen and label change of the issue, oldest first (its timeline's
        `closed`, `reopened`, `labeled` and `unlabeled` events)."""
        return [StateChange(str(e["event"]), str((e.get("actor") or {}).get("login", "")).lower(),
                            e.get("created_at"), str((e.get("label") or {}).get("name", "")))
                for e in await self.issue_timeline(repo, number)
                if e.get("event") in ("closed", "reopened", "labeled", "unlabeled")]

    # -- comments --------------------------------------------------------------------------------

    async def list_comments(
        self, repo: str, number: int, since: str | datetime | None = None
    ) -> list[JSON]:
        url_vars: dict[str, variable.VariableValue] = {
            **split_repo(repo),
            "number": number,
            "per_page": 100,
        }
        since_s = _iso(since)
        if since_s:
            url_vars["since"] = since_s
        return [
            c
            async for c in self._paginate(
                "/repos/{owner}/{repo}/issues/{number}/comments{?since,per_page}", url_vars
            )
        ]

    # -- repository ------------------------------------------------------------------------------

    async def permission(self, repo: str, login: str) -> str:
        try:
            data = await self._get(
                "/repos/{owner}/{repo}/collaborators/{username}/permission",
                {**split_repo(repo), "username": login},
            )
        except NotFound:
            return "none"
        return str(data.get("role_name") or data.get("permission") or "none")

    async def put_file(
        self, repo: str, path: str, content: bytes, message: str, sha: str | None = None
    ) -> JSON:
        payload: JSON = {"message": message, "content": base64.b64encode(content).decode()}
        if sha is not None:
            payload["sha"] = sha
        want = blob_sha(content)

        async def find() -> JSON | None:
            info = await self.file_info(repo, path)
            return {"content": info} if info is not None and info.get("sha") == want else None

        data, _, _ = await self._request(
            "PUT",
            contents_route(path),
            split_repo(repo),
            payload,
            policy="create",
            content=True,
            find_existing=find,
        )
        result: JSON = dict(data.get("content") or {}) if isinstance(data, dict) else {}
        return result

    async def dispatch(self, repo: str, event_type: str, client_payload: Mapping[str, Any]) -> None:
        await self._request(
            "POST",
            "/repos/{owner}/{repo}/dispatches",
            split_repo(repo),
            {"event_type": event_type, "client_payload": dict(client_payload)},
            policy="once",
        )

    async def list_installation_repos(self) -> list[str]:
        return [
            str(r["full_name"])
            async for r in self._paginate(
                "/installation/repositories{?per_page}",
                {"per_page": 100},
                iterable_key="repositories",
            )
        ]


InstallationForge = GitHubForge


def _implements_forge(forge: GitHubForge) -> Forge:
    return forge  # mypy checks GitHubForge against the Forge protocol here


class AppForge(_Caller):
    """Calls made as the App itself (JWT): installations, webhook deliveries, redelivery."""

    client: ForgeClient

    async def _credentials(self) -> dict[str, str]:
        return {"jwt": self.client.auth.app_jwt()}

    def _invalidate(self, credentials: Mapping[str, str]) -> None:
        self.client.auth.invalidate_jwt()

    async def get_app(self) -> JSON:
        data: JSON = await self._get("/app")
        return data

    async def list_installations(self) -> list[JSON]:
        return [i async for i in self._paginate("/app/installations{?per_page}", {"per_page": 100})]

    async def repo_installation(self, repo: str) -> JSON:
        data: JSON = await self._get("/repos/{owner}/{repo}/installation", split_repo(repo))
        return data

    async def iter_deliveries(
        self, status: str | None = None, per_page: int = 100
    ) -> AsyncIterator[JSON]:
        """Webhook deliveries, newest first, following the cursor in ``Link``."""
        url_vars: dict[str, variable.VariableValue] = {"per_page": per_page}
        if status:
            url_vars["status"] = status
        async for d in self._paginate("/app/hook/deliveries{?per_page,status}", url_vars):
            yield d

    async def get_delivery(self, delivery_id: int) -> JSON:
        data: JSON = await self._get(
            "/app/hook/deliveries/{delivery_id}", {"delivery_id": delivery_id}
        )
        return data

    async def redeliver(self, delivery_id: int) -> None:
        # A repeated redelivery is a duplicate delivery with the same GUID, which intake dedupes.
        await self._request(
            "POST",
            "/app/hook/deliveries/{delivery_id}/attempts",
            {"delivery_id": delivery_id},
            {},
            policy="idempotent",
        )


class ForgeClient:
    """The process-wide GitHub client: per-installation forges plus the App-level one."""

    def __init__(
        self,
        auth: AppAuth,
        session: aiohttp.ClientSession,
        api_url: str,
        requester: str = "vaultmail",
        *,
        config: ForgeConfig | None = None,
        sleep: Sleep = asyncio.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.auth = auth
        self.session = session
        self.api_url = api_url.rstrip("/")
        self.requester = requester
        self.config = config or ForgeConfig()
        self.shared_budget: SharedBudget | None = None  # set when replicas share a store
        self.sleep = sleep
        self.monotonic = monotonic
        self.stats = RequestStats()
        self.semaphore = asyncio.Semaphore(max(1, self.config.max_concurrency))
        self._installations: dict[int, GitHubForge] = {}
        self._app: AppForge | None = None

    @property
    def clock(self) -> Clock:
        return self.auth.clock

    def installation(self, installation_id: int, *, org: str | None = None,
                     account: int | None = None) -> GitHubForge:
        """The installation's forge (`org`, `account` add nothing: an installation is one
        account's, and its token reaches no other's)."""
        iid = int(installation_id)
        forge = self._installations.get(iid)
        if forge is None:
            forge = self._installations[iid] = GitHubForge(self, iid)
        return forge

    async def reachable(self) -> int:
        """The status the forge answers an unauthenticated request with (readiness)."""
        return await probe(self.session, self.api_url + "/")

    def app(self) -> AppForge:
        if self._app is None:
            self._app = AppForge(self, None)
        return self._app

    def forget(self, installation_id: int) -> None:
        """Drop an installation's state (uninstalled): cache, pacer, token."""
        self._installations.pop(int(installation_id), None)
        self.auth.invalidate(installation_id)


__all__ = [
    "AppForge",
    "ForgeClient",
    "ForgeConfig",
    "GitHubForge",
    "InstallationForge",
    "RequestStats",
    "split_repo",
]
