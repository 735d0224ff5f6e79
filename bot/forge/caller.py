"""The request loop every forge client shares, over gidgethub.

Per installation (or bot token): an ETag cache (``cachetools.LRUCache`` handed to gidgethub,
which keys by URL only, hence one cache per installation) so an unchanged read comes back 304
and costs no rate limit; one token refresh and retry on 401; writes one at a time, in turns
shared fairly between the principals they are made for, and paced by a
:class:`~bot.forge.pacing.WritePacer`; 403/429 rate limits
waited out (``retry-after``, else ``x-ratelimit-reset`` when nothing remains, else
``secondary_wait`` doubling), then :class:`RateLimited`; 5xx, timeouts and connection errors
retried with backoff and jitter for reads and idempotent writes; a create never retried blind
(the item carrying the caller's ``marker`` is looked for after an ambiguous failure); request
counters (:class:`RequestStats`) and structured logs with the installation id.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import contextvars
import functools
import json
import logging
import random
import re
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol
from urllib.parse import quote, unquote, urljoin, urlsplit

import aiohttp
import cachetools
import gidgethub.abc
import gidgethub.aiohttp
from gidgethub import HTTPException, InvalidField, ValidationError, sansio
from uritemplate import URITemplate, variable

from bot import jsontext, metrics
from bot.private_files import write_private
from bot.store import lease

from . import markers, writes
from .base import (
    JSON,
    contents_at_most,
    contents_route,
    file_meta,
    file_or_none,
    file_text,
)
from .clock import Clock
from .errors import (
    FileTooLarge,
    ForgeError,
    MovedAway,
    NotFound,
    OutcomeUnknown,
    PermissionDenied,
    PutOff,
    RateLimited,
    TransientError,
    Unauthorized,
    ValidationFailed,
)
from .pacing import Sleep, WritePacer, budget_wait, budget_waits, too_long, wait_at_most

log = logging.getLogger("vaultmail.forge")
_route: contextvars.ContextVar[str] = contextvars.ContextVar("forge_route", default="other")

ACCEPT = sansio.accept_format()
UrlVars = Mapping[str, variable.VariableValue]
Policy = Literal["read", "idempotent", "create", "once"]
_NO_BODY = b""
ISSUE_FIELDS = frozenset(
    {"title", "body", "state", "state_reason", "labels", "assignees", "milestone"}
)


@dataclass(frozen=True)
class ForgeConfig:
    """Tunables; the defaults follow GitHub's advice, tests shrink the waits."""

    write_interval: float = 0.0  # extra pause between writes; creations have their own budget
    content_per_minute: int = 80  # content-creating requests (issues, comments) per minute
    content_per_hour: int = 500  # ... and per hour
    principal_share: float = 0.75  # of each budget, the most one principal may take
    endpoint_points_per_minute: int = 900  # GitHub's per-endpoint budget (a write costs 5); 0 off
    timeout: float = 30.0  # aiohttp total timeout per request
    max_attempts: int = 4  # tries for 5xx / timeouts / connection errors
    backoff_base: float = 1.0  # first backoff; doubles each retry
    backoff_max: float = 30.0
    jitter: float = 0.25  # +/- fraction applied to each backoff
    rate_limit_attempts: int = 6  # tries for 403/429 rate limits
    secondary_wait: float = 60.0  # first wait on a secondary limit without retry-after
    max_wait: float = 900.0  # a longer rate-limit wait raises RateLimited (the worker reschedules)
    max_concurrency: int = 20  # requests in flight per client (GitHub allows 100)
    etag_cache_size: int = 1024  # cached GET responses per installation
    marker_window: float = 3600.0  # marker search looks at items updated this recently
    marker_search_pages: int = 3
    bot_login: str | None = None  # "<slug>[bot]"; when unset, any Bot-authored item matches


@dataclass
class RequestStats:
    """Counters for benchmarks and the request log."""

    by_method: Counter[str] = field(default_factory=Counter)
    by_status: Counter[int] = field(default_factory=Counter)
    not_modified: int = 0  # 304s: conditional reads served from the ETag cache
    retries: int = 0  # 5xx / timeout retries
    auth_refreshes: int = 0  # 401 -> new token -> retry
    rate_limit_waits: int = 0
    waited: float = 0.0  # seconds slept on rate limits and backoff (not pacing)
    paced: float = 0.0  # seconds waited for a write turn (pacing, and the writes ahead)
    marker_recoveries: int = 0  # creates found by marker after an ambiguous failure

    @property
    def requests(self) -> int:
        return sum(self.by_method.values())

    def snapshot(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "by_method": dict(self.by_method),
            "by_status": dict(self.by_status),
            "not_modified": self.not_modified,
            "retries": self.retries,
            "auth_refreshes": self.auth_refreshes,
            "rate_limit_waits": self.rate_limit_waits,
            "waited": round(self.waited, 3),
            "paced": round(self.paced, 3),
            "marker_recoveries": self.marker_recoveries,
        }


Observer = Callable[[str, str, int, Mapping[str, str]], None]


class _GitHubAPI(gidgethub.aiohttp.GitHubAPI):
    """gidgethub with a per-request timeout and a response observer (counters, rate headers)."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        requester: str,
        *,
        base_url: str,
        cache: cachetools.LRUCache[str, Any] | None,
        timeout: float,
        observe: Observer,
    ) -> None:
        super().__init__(session, requester, cache=cache, base_url=base_url)
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._observe = observe

    async def _request(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes = b"",
        read_at_most: int | None = None,
    ) -> tuple[int, Mapping[str, str], bytes]:
        """One request, redirects followed on the forge's own origin only (GitHub's, of a
        renamed repository, stay on it), all of them within the one timeout: followed
        elsewhere, a write's body would go where the forge's answer says. A write follows 307
        and 308 (sent again as it was) and 303 (it was made: its result read with a GET);
        another redirect, or one elsewhere, is the answer (gidgethub raises it).

        A request of `/repos/{owner}/{repo}/...` is followed only into a repository that is
        still `owner`'s (`_repository_at`): GitHub leads a repository transferred away by its
        old name as it does one renamed, and public there it reads without the token's grant;
        one gone to another owner raises MovedAway (a NotFound). `read_at_most`: the most
        of the answer's body read (FileTooLarge past it, `_body`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self._timeout.total or 0.0)
        timeout = self._timeout
        asked = _repository_in(url, self.base_url)
        for _ in range(_REDIRECTS_AT_MOST + 1):
            async with self._session.request(
                method, url, headers=headers, data=body, timeout=timeout,
                allow_redirects=False,
            ) as response:
                payload = await _body(response, read_at_most, method, url)
            self._observe(method, url, response.status, response.headers)
            location = response.headers.get("location")
            reading = method in ("GET", "HEAD")
            if location is None or response.status not in (
                    _READ_REDIRECTS if reading else _WRITE_REDIRECTS):
                break
            target = urljoin(url, location)
            if not _followable(target, url):
                log.warning("forge redirect not followed: not on the forge's own origin",
                            extra={"method": method, "url": url,
                                   "to": urlsplit(target).netloc.rpartition("@")[2]})
                break
            if asked is not None:
                now = await self._repository_at(target, headers)
                if now is None:
                    log.warning("forge redirect not followed: not to a repository",
                                extra={"method": method, "url": url, "to": target})
                    break
                if now.partition("/")[0] != asked.partition("/")[0]:
                    raise MovedAway(f"{asked} now belongs to another owner ({now})", was=asked,
                                    now=now, status=404, method=method, url=url)
            if response.status == 303 and not reading:  # (the write was made)
                method, body = "GET", b""
                headers = {k: v for k, v in headers.items()
                           if k.lower() not in ("content-type", "content-length")}
            url = target
            left = deadline - loop.time()
            if self._timeout.total is not None and left <= 0:
                raise TimeoutError(f"{method} {url}: redirects took past the timeout")
            timeout = aiohttp.ClientTimeout(total=left if self._timeout.total else None)
        return response.status, response.headers, payload

    async def _repository_at(self, target: str, headers: Mapping[str, str]) -> str | None:
        """The full name (lower case) of the repository a redirect leads to: in its path
        (Gitea leads to `/repos/{owner}/{repo}/...`), or read at GitHub's `/repositories/{id}`
        with the request's own credentials (a conditional read: the ETag cache answers it
        again at no cost); None when `target` is in no repository."""
        now = _repository_in(target, self.base_url)
        if now is not None:
            return now
        path = _api_path(target, self.base_url)
        if path is None or len(path) < 2 or path[0] != "repositories" or not path[1].isdigit():
            return None
        credentials = {k: v for k, v in headers.items() if k.lower() == "authorization"}
        data, _, _ = await self._make_request(
            "GET", f"{self.base_url.rstrip('/')}/repositories/{path[1]}", None, _NO_BODY,
            ACCEPT, extra_headers=credentials)
        name = data.get("full_name") if isinstance(data, dict) else None
        return name.lower() if isinstance(name, str) else None

    async def call(
        self,
        method: str,
        url: str,
        url_vars: UrlVars | None,
        data: Any,
        *,
        oauth_token: str | None = None,
        jwt: str | None = None,
        read_at_most: int | None = None,
    ) -> tuple[Any, str | None, int]:
        return await self._make_request(
            method, url, url_vars, data, ACCEPT, jwt=jwt, oauth_token=oauth_token,
            read_at_most=read_at_most,
        )

    async def _make_request(
        self,
        method: str,
        url: str,
        url_vars: UrlVars | None,
        data: Any,
        accept: str,
        jwt: str | None = None,
        oauth_token: str | None = None,
        content_type: str = gidgethub.abc.JSON_CONTENT_TYPE,
        extra_headers: dict[str, str] | None = None,
        read_at_most: int | None = None,
    ) -> tuple[Any, str | None, int]:
        """gidgethub's request, made the way it makes it (its headers, its ETag cache, its
        errors), with JSON read and written in C: its own reading, the standard library's
        and a MIME parser per response, was a sixth of the app's CPU per event
        (bench.probot_compare). The cache keeps a read's text (`_Read`), not its value, so
        each caller gets an object of its own. A body that is not JSON is gidgethub's, as is
        every answer but a 2xx in JSON."""
        if content_type != gidgethub.abc.JSON_CONTENT_TYPE:
            return await super()._make_request(
                method, url, url_vars, data, accept, jwt=jwt, oauth_token=oauth_token,
                content_type=content_type, extra_headers=extra_headers)
        if jwt is not None and oauth_token is not None:
            raise ValueError("Cannot pass both oauth_token and jwt.")
        filled_url = url if not url_vars and "://" in url else sansio.format_url(
            url, url_vars, base_url=self.base_url)
        if jwt is None and oauth_token is None:  # the client's own, as gidgethub falls back to
            oauth_token, jwt = self.oauth_token, self._get_app_jwt()
        headers = sansio.create_headers(self.requester, accept=accept, jwt=jwt,
                                        oauth_token=oauth_token)
        if extra_headers is not None:
            headers.update(extra_headers)
        cached: _Read | None = None
        if data == b"":  # no body (None is JSON's null)
            body = b""
            headers["content-length"] = "0"
            if method == "GET" and self._cache is not None:
                etag, modified, cached, _ = self._cache.get(filled_url, (None, None, None, None))
                if etag is not None:
                    headers["if-none-match"] = etag
                if modified is not None:
                    headers["if-modified-since"] = modified
        else:
            body = jsontext.dumps(data)
            headers["content-type"] = _JSON_UTF_8
            headers["content-length"] = str(len(body))
        status, response_headers, text = await self._request(method, filled_url, headers, body,
                                                             read_at_most)
        if status == 304 and cached is not None:  # what it read before, read again
            return _decoded(cached.content_type, cached.text), cached.more, status
        kind = response_headers.get("content-type")
        more: str | None = None
        if status in _SUCCESS and _is_json(kind) and "link" not in response_headers:
            value = _decoded(kind, text)
        else:  # an error, a page of a listing, text that is not JSON: all as gidgethub reads it
            value, self.rate_limit, more = sansio.decipher_response(status, response_headers, text)
        if method == "GET" and data == b"" and self._cache is not None and (
                "etag" in response_headers or "last-modified" in response_headers):
            self._cache[filled_url] = (response_headers.get("etag"),
                                       response_headers.get("last-modified"),
                                       _Read(kind, text, more), more)
        return value, more, status


_SUCCESS = frozenset((200, 201, 202, 204))  # what gidgethub answers rather than raises
_READ_REDIRECTS = frozenset((301, 302, 303, 307, 308))
# 307 and 308: "repeat the request as it was"; 303: done, the result is there (RFC 9110 15.4)
_WRITE_REDIRECTS = frozenset((303, 307, 308))
_REDIRECTS_AT_MOST = 10  # (aiohttp's own limit)
_JSON_UTF_8 = "application/json; charset=utf-8"


async def _body(response: aiohttp.ClientResponse, at_most: int | None, method: str,
                url: str) -> bytes:
    """The answer's body; with `at_most`, FileTooLarge once it is over that many bytes (a
    Content-Length over it: before any is read), the connection closed, not drained."""
    if at_most is None:
        return await response.read()
    declared = None if "content-encoding" in response.headers else response.content_length
    if declared is None or declared <= at_most:
        try:
            await response.content.readexactly(at_most + 1)
        except asyncio.IncompleteReadError as whole:  # it ended within the limit
            return whole.partial
    response.close()
    raise FileTooLarge(f"the answer is over {at_most:,} bytes, the most read of it",
                       at_most=at_most, status=response.status, method=method, url=url)


@dataclass(frozen=True, slots=True)
class _Read:
    """A read the ETag cache keeps: its text, decoded again for each caller it serves."""

    content_type: str | None
    text: bytes
    more: str | None


def _is_json(content_type: str | None) -> bool:
    """Whether a response of this content type is JSON in UTF-8 (the forges' every answer)."""
    if not content_type:
        return False
    media, _, params = content_type.partition(";")
    return media.strip().lower() == "application/json" and params.strip().lower() in (
        "", "charset=utf-8", 'charset="utf-8"')


def _decoded(content_type: str | None, text: bytes) -> Any:
    """A 2xx body's value, as gidgethub would read it."""
    if _is_json(content_type):
        return jsontext.loads(text) if text else None
    return sansio.decipher_response(200, {"content-type": content_type or ""}, text)[0]


_EXPRESSION = re.compile(r"{([^}]+)}")  # as uritemplate finds them
_SIMPLE_NAME = re.compile(r"[A-Za-z0-9_]+")  # `{name}`: no operator, no modifier


@functools.lru_cache(maxsize=512)
def _template(base_url: str, url: str) -> tuple[URITemplate, tuple[str, ...] | None]:
    """The template of `url` on `base_url`, parsed once; and when each of its expressions is
    a simple `{name}` (every route of the hot path), its pieces: literal, name, ..., literal."""
    joined = urljoin(base_url.removesuffix("/") + "/", url.removeprefix("/"))
    pieces = tuple(_EXPRESSION.split(joined))
    simple = all(_SIMPLE_NAME.fullmatch(name) for name in pieces[1::2])
    return URITemplate(joined), pieces if simple else None


def format_url(base_url: str, url: str, url_vars: UrlVars | None) -> str:
    """gidgethub's `format_url`, with each template parsed once: it was parsed twice per
    request (here and in gidgethub), a tenth of a write's CPU (bench.probot_compare). A
    template of simple `{name}`s given text and numbers is filled in here, as RFC 6570 (and
    uritemplate) does: each value percent-encoded but for unreserved characters; anything
    else (a list, a missing value, `{?query}`) is uritemplate's."""
    template, pieces = _template(base_url, url)
    if pieces is not None:
        out = [pieces[0]]
        for i in range(1, len(pieces), 2):
            value = url_vars.get(pieces[i]) if url_vars else None
            if type(value) is str:
                out.append(quote(value, safe=""))
            elif type(value) is int:
                out.append(str(value))
            else:
                break
            out.append(pieces[i + 1])
        else:
            return "".join(out)
    return str(template.expand(dict(url_vars) if url_vars else {}))


def same_origin(url: str, base: str) -> bool:
    """Whether `url` (absolute, or relative to `base`) is on `base`'s scheme, host and port."""
    def origin(u: str) -> tuple[str, str, int | None]:
        parts = urlsplit(urljoin(base, u))
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
        return parts.scheme.lower(), (parts.hostname or "").lower(), port
    try:
        return origin(url) == origin(base)
    except ValueError:  # a port that is not a number
        return False


def _followable(target: str, url: str) -> bool:
    """Whether a redirect from `url` to `target` (absolute) stays on the forge: its origin,
    and nothing a URL parser could read another way (userinfo, backslashes, whitespace)."""
    if any(c in target for c in "\\ \t\r\n"):
        return False
    try:
        parts = urlsplit(target)
    except ValueError:
        return False
    return "@" not in parts.netloc and same_origin(target, url)


def _api_path(url: str, base: str) -> list[str] | None:
    """The segments of `url`'s path under the API's (`base`), as the forge names them
    (percent-decoded); None when `url` is not under it."""
    prefix = urlsplit(base).path.rstrip("/") + "/"
    path = urlsplit(url).path
    if not path.startswith(prefix):
        return None
    return [unquote(part) for part in path[len(prefix):].split("/")]


def _repository_in(url: str, base: str) -> str | None:
    """`owner/repo` (lower case) of a URL of the forge's `/repos/{owner}/{repo}/...`."""
    path = _api_path(url, base)
    if path is None or len(path) < 3 or path[0] != "repos" or not path[1] or not path[2]:
        return None
    return f"{path[1]}/{path[2]}".lower()


def next_on_forge(url: str, base: str) -> str | None:
    """Where to ask for a listing's next page that the forge named `url`: `url` itself on the
    forge's own origin; its path and query on the forge's origin when the forge names itself
    otherwise but the path is under the API's (Gitea builds its links from ROOT_URL, which
    behind a proxy or a container's name is not the URL the app is given); None elsewhere."""
    if same_origin(url, base):
        return urljoin(base, url)  # (a path alone is the forge's: asked where it points)
    try:
        parts, api = urlsplit(url), urlsplit(base)
    except ValueError:
        return None
    prefix = api.path.rstrip("/") + "/"
    if not parts.path.startswith(prefix):
        return None
    return f"{api.scheme}://{api.netloc}{parts.path}" + (f"?{parts.query}" if parts.query else "")


def split_repo(repo: str) -> dict[str, str]:
    owner, sep, name = repo.partition("/")
    if not sep or not owner or not name or "/" in name:
        raise ValueError(f"repository must be 'owner/name', not {repo!r}")
    return {"owner": owner, "repo": name}


def _iso(value: str | datetime | None) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _iso_epoch(ts: float) -> str:
    return datetime.fromtimestamp(int(ts), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        value = headers.get(name.title())
    return value


def _error(exc: HTTPException, method: str, url: str) -> ForgeError:
    status = int(exc.status_code)
    message = str(exc) or exc.status_code.phrase
    kind: type[ForgeError] = ForgeError
    details: Any = None
    if status == 404:
        kind = NotFound
    elif status == 401:
        kind = Unauthorized
    elif status == 403:
        kind = PermissionDenied
    elif status == 422:
        kind = ValidationFailed
        if isinstance(exc, InvalidField | ValidationError):
            details = exc.errors
    elif status >= 500:
        kind = TransientError
    return kind(
        message, status=status, method=method, url=url, headers=exc.headers, details=details
    )


metrics.BUDGET_WAIT.set_function(lambda: budget_waits()[1])


@functools.lru_cache(maxsize=1024)
def _requests_counter(method: str, route: str, status: int) -> Any:
    """FORGE_REQUESTS' child for these labels: prometheus_client looks a child up under a lock
    and from a new tuple of strings each time, a tenth of a request's bookkeeping."""
    return metrics.FORGE_REQUESTS.labels(method=method, route=route, status=str(status))


class SharedBudget(Protocol):
    """The write budget every replica of the app draws on (bot.store.budget): how long this
    write must still wait so that all replicas together stay within one App's limits."""

    async def reserve(self, who: str, endpoint: str, content: bool,
                      at_most: float | None = None) -> float:
        """The seconds this write waits for its place; with `at_most`, a place further off
        is not taken (nothing recorded) and the wait it would have had is returned."""


class CallerClient(Protocol):
    """What the request loop needs from its process-wide client (GitHub's or Gitea's)."""

    config: ForgeConfig
    shared_budget: SharedBudget | None  # several replicas: their common budget
    session: aiohttp.ClientSession
    requester: str
    api_url: str
    sleep: Sleep
    monotonic: Callable[[], float]
    stats: RequestStats
    semaphore: asyncio.Semaphore

    @property
    def clock(self) -> Clock: ...


class _Caller(abc.ABC):
    """The request loop shared by installation and App clients (and by the Gitea forge, whose
    API gidgethub speaks as well: `Authorization: token`, Link pagination, JSON errors):
    credentials, retries, waits."""

    client: CallerClient

    def __init__(self, client: CallerClient, installation_id: int | None) -> None:
        self.client = client
        self.config = client.config
        self.stats = RequestStats()
        self._log_extra: dict[str, Any] = {"installation_id": installation_id}
        self._gh = _GitHubAPI(
            client.session,
            client.requester,
            base_url=client.api_url,
            cache=cachetools.LRUCache(maxsize=self.config.etag_cache_size),
            timeout=self.config.timeout,
            observe=self._observe,
        )
        self.pacer = WritePacer(  # also the write lock: one write at a time, fair turns
            min_interval=self.config.write_interval,
            content_per_minute=self.config.content_per_minute,
            content_per_hour=self.config.content_per_hour,
            principal_share=self.config.principal_share,
            endpoint_points_per_minute=self.config.endpoint_points_per_minute,
            monotonic=client.monotonic,
            sleep=client.sleep,
        )
        self._blocked_until = 0.0  # on the auth clock: primary limit exhausted until then
        self.rate_limit: dict[str, int] | None = None  # last x-ratelimit-{limit,remaining,reset}
        self._remaining_gauge: Any = None  # RATE_REMAINING's child for this installation

    async def _shared_turn(self, endpoint: str, content: bool) -> float:
        """With several replicas, wait for this write's place in the budget they share (this
        replica's own pacer places it among its own writes after); outside any turn."""
        shared = self.client.shared_budget
        if shared is None:
            return 0.0
        wait = await shared.reserve(self._budget_key, endpoint, content,
                                    at_most=wait_at_most.get())
        if too_long(wait):  # (no place was taken)
            raise PutOff(f"the write budget the replicas share allows this write in "
                         f"{wait:.0f} s: put off until then", retry_after=wait)
        if wait > 0:
            with budget_wait(wait):
                await self.client.sleep(wait)
        return max(0.0, wait)

    @property
    def _budget_key(self) -> str:
        """Whose budget a write draws on: the installation's (the App's own calls: "app")."""
        installation = self._log_extra.get("installation_id")
        return "app" if installation is None else str(installation)

    # -- credentials: each kind of caller says how it authenticates ----------------------------

    @abc.abstractmethod
    async def _credentials(self) -> dict[str, str]:
        """gidgethub keyword arguments (oauth_token= or jwt=) for the next request."""

    @abc.abstractmethod
    def _invalidate(self, credentials: Mapping[str, str]) -> None:
        """Forget credentials the forge refused with a 401."""

    # -- bookkeeping -----------------------------------------------------------------------------

    def _observe(self, method: str, url: str, status: int, headers: Mapping[str, str]) -> None:
        _requests_counter(method, _route.get(), status).inc()
        for stats in (self.stats, self.client.stats):
            stats.by_method[method] += 1
            stats.by_status[status] += 1
            if status == 304:
                stats.not_modified += 1
        try:
            limit = int(_header(headers, "x-ratelimit-limit") or "")
            remaining = int(_header(headers, "x-ratelimit-remaining") or "")
            reset = int(float(_header(headers, "x-ratelimit-reset") or ""))
        except ValueError:
            pass
        else:
            resource = _header(headers, "x-ratelimit-resource") or "core"
            if resource == "core":  # search has its own, per-minute budget
                self.rate_limit = {"limit": limit, "remaining": remaining, "reset": reset}
                if self._remaining_gauge is None:  # (a labelled child: looked up once)
                    self._remaining_gauge = metrics.RATE_REMAINING.labels(
                        installation=str(self._log_extra.get("installation_id")))
                self._remaining_gauge.set(remaining)
                if remaining <= 0 and status < 400:
                    self._blocked_until = max(self._blocked_until, float(reset))
        if log.isEnabledFor(logging.DEBUG):  # (its arguments cost more than the check)
            log.debug(
                "%s %s -> %s",
                method,
                urlsplit(url).path,
                status,
                extra={**self._log_extra, "method": method, "url": url, "status": status},
            )

    def _count(self, attr: str, amount: float = 1) -> None:
        for stats in (self.stats, self.client.stats):
            setattr(stats, attr, getattr(stats, attr) + amount)

    async def _sleep(self, seconds: float, attr: str = "waited") -> None:
        if seconds > 0:
            self._count(attr, seconds)
            await self.client.sleep(seconds)

    def _backoff(self, attempt: int) -> float:
        cfg = self.config
        base = min(cfg.backoff_max, cfg.backoff_base * 2.0 ** (attempt - 1))
        return max(0.0, base * (1 + random.uniform(-cfg.jitter, cfg.jitter)))

    def _limit_wait(self, exc: HTTPException, limit_tries: int) -> float | None:
        """Seconds to wait for a rate-limited response, or None if it is no rate limit."""
        status = int(exc.status_code)
        if status not in (403, 429):
            return None
        headers = exc.headers
        retry_after = _header(headers, "retry-after")
        if retry_after:
            try:
                return max(0.0, float(retry_after))
            except ValueError:
                try:
                    when = parsedate_to_datetime(retry_after).timestamp()
                    return max(0.0, when - self.client.clock.now())
                except (TypeError, ValueError):
                    pass
        remaining = _header(headers, "x-ratelimit-remaining")
        reset = _header(headers, "x-ratelimit-reset")
        if remaining is not None and remaining.strip() == "0" and reset:
            try:
                return max(0.0, float(reset) - self.client.clock.now()) + 1.0
            except ValueError:
                pass
        message = str(exc).lower()
        if status == 429 or "rate limit" in message or "abuse" in message:
            return self.config.secondary_wait * 2.0 ** (limit_tries - 1)
        return None  # a plain 403: permission denied

    async def _respect_primary_limit(self, method: str, url: str) -> None:
        wait = self._blocked_until - self.client.clock.now()
        if wait <= 0:
            return
        if too_long(wait) and wait <= self.config.max_wait:  # the reset is the forge's word
            raise PutOff(f"primary rate limit exhausted for {wait:.0f} s more: put off",
                         retry_after=wait, method=method, url=url)
        if wait > self.config.max_wait:
            raise RateLimited(
                f"primary rate limit exhausted for {wait:.0f} s more",
                retry_after=wait,
                method=method,
                url=url,
            )
        log.warning(
            "primary rate limit exhausted; waiting %.1f s",
            wait,
            extra={**self._log_extra, "method": method, "url": url, "wait": wait},
        )
        self._count("rate_limit_waits")
        await self._sleep(wait)

    # -- the request loop ------------------------------------------------------------------------

    async def _request(
        self,
        method: str,
        url: str,
        url_vars: UrlVars | None = None,
        data: Any = _NO_BODY,
        *,
        policy: Policy | None = None,
        content: bool = False,
        find_existing: Callable[[], Awaitable[Any]] | None = None,
        read_at_most: int | None = None,
    ) -> tuple[Any, str | None, int]:
        """One logical request: returns ``(data, next_url, status)``.

        ``policy`` says what may be retried after an ambiguous failure (5xx, timeout, dropped
        connection): ``read`` and ``idempotent`` retry; ``create`` calls ``find_existing`` and
        returns what it finds (as status 200) before retrying, or raises OutcomeUnknown without
        it; ``once`` raises OutcomeUnknown. ``read_at_most``: the most of a read's answer
        read (FileTooLarge past it, not retried: the file is what it is).
        """
        if policy is None:
            policy = "read" if method == "GET" else "idempotent"
        if method == "GET":
            # (a read's value is the caller's own: the ETag cache keeps the text it was read from)
            return await self._attempts(method, url, url_vars, data, policy, content,
                                        find_existing, read_at_most=read_at_most)
        # one write at a time per installation, turns shared fairly between the principals the
        # writes are made for (`pacing.writes_for`), each paced within its share of the budget
        endpoint = f"{method} {url.split('{?')[0]}"  # the budget is per route, not per URL
        writes.note()
        return await self._attempts(method, url, url_vars, data, policy, content, find_existing,
                                    endpoint=endpoint)

    @contextlib.asynccontextmanager
    async def _write_turn(self, content: bool, endpoint: str) -> AsyncIterator[None]:
        """One attempt of a write: its place in the budget the replicas share, waited for
        first, then this process's turn (given once its own pacing lets it go), held for the
        request alone. Every wait (for budget, for a backoff, for a rate limit) is outside
        the turn: a creation waiting an hour for the next one holds no label move."""
        shared = await self._shared_turn(endpoint, content)
        async with self.pacer.turn(content, endpoint=endpoint) as waited:
            await lease.check()  # (a named lock held for this write may have gone meanwhile)
            waited += shared
            self._count("paced", waited)
            metrics.PACING_SECONDS.inc(waited)
            metrics.PACING_WAIT.labels(kind="creation" if content else "write").observe(waited)
            yield

    async def _attempts(
        self,
        method: str,
        url: str,
        url_vars: UrlVars | None,
        data: Any,
        policy: Policy,
        content: bool,
        find_existing: Callable[[], Awaitable[Any]] | None,
        endpoint: str | None = None,
        read_at_most: int | None = None,
    ) -> tuple[Any, str | None, int]:
        cfg = self.config
        _route.set(url.split("{?")[0])  # the template, not the URL: a metric label per route
        full_url = format_url(self.client.api_url, url, url_vars)
        extra = {**self._log_extra, "method": method, "url": full_url}
        transient_tries = 0
        limit_tries = 0
        refreshed = False
        while True:
            await self._respect_primary_limit(method, full_url)
            caught: HTTPException | TimeoutError | aiohttp.ClientError
            async with contextlib.AsyncExitStack() as turn:
                if method != "GET":  # each attempt paced, its turn held for it alone: what
                    # follows a failure (a backoff, a rate limit's wait) waits outside it
                    await turn.enter_async_context(self._write_turn(content, endpoint or method))
                    # (in its turn: checked just before the write, however long it waited)
                    await self._before_write(url, url_vars)
                credentials = await self._credentials()  # (fresh after a long wait)
                try:
                    async with self.client.semaphore:
                        # the URL already expanded: gidgethub only joins it to the base
                        return await self._gh.call(method, full_url, None, data,
                                                   read_at_most=read_at_most, **credentials)
                except MovedAway as exc:  # no retry mends it: a person must (the installation's)
                    log.error("a repository moved to another owner: %s is %s now; nothing of "
                              "it is read (its owner's admin moves it back, or the office's "
                              "config names another)", exc.was, exc.now,
                              extra={**extra, "repo": exc.was, "now": exc.now})
                    raise
                except (HTTPException, TimeoutError, aiohttp.ClientError) as exc:
                    caught = exc
            failure: str
            try:
                raise caught
            except HTTPException as exc:
                status = int(exc.status_code)
                if status == 401 and not refreshed:
                    refreshed = True
                    self._count("auth_refreshes")
                    log.info("401; refreshing credentials and retrying", extra=extra)
                    self._invalidate(credentials)
                    continue
                if status in (403, 429):
                    limit_tries += 1
                    wait = self._limit_wait(exc, limit_tries)
                    if wait is not None:
                        if (limit_tries >= cfg.rate_limit_attempts or wait > cfg.max_wait
                                or too_long(wait)):
                            raise RateLimited(
                                f"rate limited, gave up after {limit_tries} tries: {exc}",
                                retry_after=wait,
                                status=status,
                                method=method,
                                url=full_url,
                                headers=exc.headers,
                            ) from exc
                        log.warning(
                            "rate limited (%s); waiting %.1f s",
                            status,
                            wait,
                            extra={**extra, "status": status, "wait": wait, "attempt": limit_tries},
                        )
                        self._count("rate_limit_waits")
                        await self._sleep(wait)
                        continue
                if status < 500:
                    raise _error(exc, method, full_url) from exc
                failure = f"{status} {exc}"
                last_exc: Exception = exc
            except (TimeoutError, aiohttp.ClientError) as exc:
                failure = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                last_exc = exc
            # an ambiguous failure: 5xx, timeout or a connection lost; but a connection never
            # made (refused, no route, a name not found, TLS refused) sent nothing, and any
            # write is tried again after it, as a write that cannot land twice
            unsent = isinstance(last_exc, aiohttp.ClientConnectorError)
            transient_tries += 1
            status_or_none = (
                int(last_exc.status_code) if isinstance(last_exc, HTTPException) else None
            )
            if not unsent and (policy == "once" or (policy == "create" and find_existing is None)):
                raise OutcomeUnknown(
                    f"{failure}; the write may or may not have landed, not retried",
                    status=status_or_none,
                    method=method,
                    url=full_url,
                ) from last_exc
            delay = self._backoff(transient_tries)
            if policy == "create" and find_existing is not None and not unsent:
                # never retry a create blind: did it land after all? (look even after the last try)
                await self._sleep(delay)
                try:
                    found = await find_existing()
                except ForgeError as search_exc:
                    raise OutcomeUnknown(
                        f"{failure}; looking for the marker failed too ({search_exc})",
                        status=status_or_none,
                        method=method,
                        url=full_url,
                    ) from search_exc
                if found is not None:
                    log.info("create had landed; found it by marker", extra=extra)
                    self._count("marker_recoveries")
                    return found, None, 200
                delay = 0.0
            if transient_tries >= cfg.max_attempts:
                raise TransientError(
                    f"{failure}; gave up after {transient_tries} tries",
                    status=status_or_none,
                    method=method,
                    url=full_url,
                ) from last_exc
            log.warning(
                "%s; retrying",
                failure,
                extra={**extra, "status": status_or_none, "attempt": transient_tries},
            )
            self._count("retries")
            await self._sleep(delay)

    async def _before_write(self, url: str, url_vars: UrlVars | None) -> None:
        """What a forge checks before each attempt of a write, in its turn (Gitea: whose the
        repository is, `GiteaForge._before_write`); nothing by default."""
        return

    async def _get(self, url: str, url_vars: UrlVars | None = None, *,
                   read_at_most: int | None = None) -> Any:
        data, _, _ = await self._request("GET", url, url_vars, read_at_most=read_at_most)
        return data

    async def _paginate(
        self,
        url: str,
        url_vars: UrlVars | None = None,
        *,
        iterable_key: str | None = None,
        max_pages: int | None = None,
    ) -> AsyncIterator[Any]:
        """Follow ``Link: rel="next"``; never constructs page URLs itself."""
        next_url: str | None = url
        pages = 0
        while next_url:
            data, more, _ = await self._request("GET", next_url, url_vars)
            url_vars = None  # next links are complete URLs
            if iterable_key is not None and isinstance(data, dict):
                data = data.get(iterable_key, [])
            for item in data or []:
                yield item
            pages += 1
            if max_pages is not None and pages >= max_pages:
                return
            if more is not None:
                on_forge = next_on_forge(more, self.client.api_url)
                if on_forge is None:  # followed, it would take the app's token elsewhere
                    raise ForgeError(
                        f"the forge's next page is at {more!r}, outside the forge's URL "
                        f"{self.client.api_url}: not followed with the app's token", method="GET",
                        url=more)
                more = on_forge
            next_url = more


# what a saved cache holds: each read's text (`_Read`); a file of another format (version 1
# kept values) is not read, which costs one full read each. Its installation is under
# `installation`, not version 1's `installation_id`, so a version 1 reader (a rollback) skips
# the file rather than take a text for a value.
ETAG_CACHE_FORMAT = 2


def save_etag_cache(cache: Any, installation_id: int, path: Path) -> None:
    if cache is None:
        return
    entries = [[url, [etag, modified, {"content_type": read.content_type,
                                       "text": read.text.decode("utf-8", "surrogateescape"),
                                       "more": read.more}, more]]
               for url, (etag, modified, read, more) in cache.items() if isinstance(read, _Read)]
    # the forge's answers, private repositories' issues among them: the app's alone
    write_private(path, json.dumps({"format": ETAG_CACHE_FORMAT,
                                    "installation": installation_id, "entries": entries}))


def load_etag_cache(cache: Any, installation_id: int, path: Path) -> None:
    if cache is None or not path.exists():
        return
    try:
        doc = json.loads(path.read_text())
        if doc.get("format") != ETAG_CACHE_FORMAT or doc.get("installation") != installation_id:
            return
        for url, (etag, modified, read, more) in doc.get("entries", []):
            cache[url] = (etag, modified, _Read(
                read["content_type"], read["text"].encode("utf-8", "surrogateescape"),
                read["more"]), more)
    except (ValueError, TypeError, KeyError, AttributeError):
        return  # a damaged cache only costs full reads


class RepoCaller(_Caller):
    """What every forge's installation client does the same way: comments by id, and the
    conditional-read cache kept across processes (so a second `vaultmail reindex` gets 304s)."""

    installation_id: int

    if TYPE_CHECKING:  # each forge knows its own comments (the app's login, its paging)
        def _by_app(self, item: Mapping[str, Any]) -> bool: ...

        async def list_comments(self, repo: str, number: int,
                                since: str | datetime | None = None) -> list[JSON]: ...

        def iter_issues(self, repo: str, state: str = "all",
                        labels: Sequence[str] | None = None,
                        since: str | datetime | None = None) -> AsyncIterator[JSON]: ...

    async def owner_confirmed(self, repo: str) -> None:
        """(base.Forge.owner_confirmed) Nothing by default: an installation's token reaches
        only its own account's repositories."""
        return

    # -- files (the contents API: GitHub's and Gitea's alike) --------------------------------
    async def _file(self, repo: str, path: str, ref: str | None = None,
                    at_most: int | None = None) -> JSON | None:
        """The contents API's answer for a file on the default branch, or as of `ref`; of
        one over `at_most` bytes, no more read than its size takes (FileTooLarge)."""
        route, args = contents_route(path), split_repo(repo)
        if ref is not None:
            route, args = route + "{?ref}", {**args, "ref": ref}
        try:
            return file_or_none(await self._get(route, args,
                                                read_at_most=contents_at_most(at_most)))
        except NotFound:
            return None

    async def get_file(self, repo: str, path: str, *, at_most: int | None = None) -> str | None:
        data = await self._file(repo, path, at_most=at_most)
        return None if data is None else file_text(path, data, at_most)

    async def get_file_at(self, repo: str, path: str, ref: str, *,
                          at_most: int | None = None) -> str | None:
        """The text of the file at `path` as of `ref` (a branch, tag or commit sha); None when
        it has none there."""
        data = await self._file(repo, path, ref, at_most)
        return None if data is None else file_text(path, data, at_most)

    async def file_info(self, repo: str, path: str) -> JSON | None:
        data = await self._file(repo, path)
        return None if data is None else file_meta(data)

    async def marked_issues(self, repo: str, marker: str) -> list[JSON]:
        """The app's recent open issues whose body carries `marker` (a whole comment:
        `markers.carries`), oldest first."""
        since = _iso_epoch(self.client.clock.now() - self.config.marker_window)
        found = [i async for i in self.iter_issues(repo, state="open", since=since)
                 if self._by_app(i) and markers.carries(i.get("body") or "", marker)]
        return sorted(found, key=lambda i: int(i["number"]))

    async def marked_comments(self, repo: str, number: int, marker: str) -> list[JSON]:
        """The app's recent comments on the issue whose body carries `marker` (a whole
        comment: `markers.carries`), oldest first (more than one only when tries of one write
        raced: `keep_first`)."""
        since = _iso_epoch(self.client.clock.now() - self.config.marker_window)
        return [c for c in await self.list_comments(repo, number, since=since)
                if self._by_app(c) and markers.carries(c.get("body") or "", marker)]

    async def find_comment(self, repo: str, number: int, marker: str) -> JSON | None:
        """The newest recent comment by the app on the issue whose body carries `marker`."""
        found = await self.marked_comments(repo, number, marker)
        return found[-1] if found else None

    async def keep_first(self, repo: str, number: int, marker: str) -> JSON | None:
        """Delete every comment of the app's carrying `marker` but the first (returned): a
        late copy (a stalled try's create that landed after another try looked and wrote)."""
        marked = await self.marked_comments(repo, number, marker)
        for late in marked[1:]:
            log.warning("a late duplicate comment deleted", extra={
                **self._log_extra, "repo": repo, "number": number, "comment": late["id"],
                "outcome": "duplicate"})
            await self.delete_comment(repo, int(late["id"]))
        return marked[0] if marked else None

    async def delete_comment(self, repo: str, comment_id: int) -> bool:
        """Delete one of the app's comments; False when it was gone already."""
        try:
            await self._request(
                "DELETE", "/repos/{owner}/{repo}/issues/comments/{comment_id}",
                {**split_repo(repo), "comment_id": comment_id}, policy="idempotent")
        except NotFound:
            return False
        return True

    def save_etag_cache(self, path: Path) -> None:
        save_etag_cache(self._gh._cache, self.installation_id, path)

    async def repo_name_now(self, repo: str) -> str | None:
        """`repo`'s name now (`owner/name`, lower case), as the forge leads its old name to it
        (a rename: followed by the request loop), or where it went (another owner's: not
        followed, `MovedAway` names it); None when it is gone."""
        try:
            data = await self._get("/repos/{owner}/{repo}", split_repo(repo))
        except MovedAway as exc:
            return exc.now
        except NotFound:
            return None
        return str(data["full_name"]).lower()

    async def repo_closed(self, repo: str) -> Literal["gone", "archived"] | None:
        """Whether `repo` takes no writes: `gone` (404), `archived` (read-only: every write
        403); None when it takes them, or was moved away (its writes then say)."""
        try:
            data = await self._get("/repos/{owner}/{repo}", split_repo(repo))
        except MovedAway:
            return None
        except NotFound:
            return "gone"
        return "archived" if isinstance(data, dict) and data.get("archived") else None

    async def repo_name_of(self, repo_id: int) -> str | None:
        """The full name now (lower case) of the repository whose forge id is `repo_id`,
        wherever renames or transfers took it; None when it is gone (or out of reach)."""
        try:
            data = await self._get("/repositories/{id}", {"id": str(repo_id)})
        except NotFound:
            return None
        return str(data["full_name"]).lower()

    def load_etag_cache(self, path: Path) -> None:
        load_etag_cache(self._gh._cache, self.installation_id, path)

    async def create_comment(
        self, repo: str, number: int, body: str, marker: str | None = None
    ) -> JSON:
        if marker is not None and marker not in body:
            raise ValueError("marker must be contained in the body")
        find = None
        if marker is not None:

            async def find() -> JSON | None:
                return await self.find_comment(repo, number, marker)

        data: JSON
        data, _, _ = await self._request(
            "POST",
            "/repos/{owner}/{repo}/issues/{number}/comments",
            {**split_repo(repo), "number": number},
            {"body": body},
            policy="create",
            content=True,
            find_existing=find,
        )
        return data

    async def update_comment(self, repo: str, comment_id: int, body: str) -> JSON:
        data: JSON
        data, _, _ = await self._request(
            "PATCH",
            "/repos/{owner}/{repo}/issues/comments/{comment_id}",
            {**split_repo(repo), "comment_id": comment_id},
            {"body": body},
        )
        return data

    async def get_comment(self, repo: str, comment_id: int) -> JSON:
        data: JSON = await self._get(
            "/repos/{owner}/{repo}/issues/comments/{comment_id}",
            {**split_repo(repo), "comment_id": comment_id},
        )
        return data
