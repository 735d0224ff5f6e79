"""The Forge interface handlers program against.

Repositories are named ``"owner/name"``. Results are plain dicts in GitHub's JSON shape (an
issue has ``number``, ``title``, ``body``, ``state``, ``labels`` [{name, color, ...}], ``user``,
...), so a Gitea implementation translates to that shape rather than the handlers learning two
dialects.

Semantics every implementation keeps:

* writes are serialised and paced per installation; reads are conditional where the forge allows;
* ``create_issue`` / ``create_comment`` with a ``marker`` (a string contained in ``body``, such as a
  mail id) are idempotent: after an ambiguous failure the implementation looks for an existing
  item containing the marker before retrying, and returns that item if found;
* ``remove_label`` ignores a label that is not on the issue (returns ``False``);
* ``permission`` returns ``"none"`` when the user is unknown to the repository;
* ``get_file`` and ``file_info`` return ``None`` when the file does not exist;
* errors are :mod:`bot.forge.errors` exceptions.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable
from urllib.parse import quote

import aiohttp

from labels.catalogue import Label

from .errors import FileTooLarge, UnreadableFile

JSON = dict[str, Any]


@dataclass(frozen=True)
class StateChange:
    """A close, a reopen, or a label added or removed, as the issue's timeline shows it."""

    event: str  # GitHub's name for it: closed, reopened, labeled, unlabeled
    actor: str  # who did it: a login, lower case
    at: str | None  # when (the forge's timestamp)
    label: str = ""  # the label (the app's name for a Gitea mail state), for (un)labeled


@runtime_checkable
class Forge(Protocol):
    """One installation's view of the forge (GitHub: one installation token)."""

    installation_id: int

    async def owner_confirmed(self, repo: str) -> None:
        """Nothing when `repo` is the account's whose office this forge works for (or that
        cannot be told); else OwnerChanged: asked before what was read from it is held
        against the office for good (a mail found not to verify). Gitea only, whose one
        token reaches every org's repositories under a login another account may have
        taken; a GitHub installation's token reaches only its own account's."""
        ...

    # issues
    async def get_issue(self, repo: str, number: int) -> JSON: ...

    async def create_issue(
        self,
        repo: str,
        title: str,
        body: str,
        labels: Sequence[str] = (),
        marker: str | None = None,
        accept: Callable[[JSON], bool] | None = None,
    ) -> JSON:
        """The new issue. With `marker` (in `body`), a create whose answer was lost is found
        rather than made again (`find_issue`, with `accept`)."""
        ...

    async def update_issue(self, repo: str, number: int, **fields: Any) -> JSON:
        """``fields``: title, body, state ("open"/"closed"), state_reason, labels, assignees."""
        ...

    async def label_changes(self, repo: str, number: int, label: str) -> list[tuple[str, bool]]:
        """(who, whether added) of each change of `label` on the issue, oldest first."""
        ...

    async def state_changes(self, repo: str, number: int) -> list[StateChange]:
        """Each close, reopen and label change of the issue, oldest first (the doctor tells
        a lost write of the app's from a change not yet delivered by them)."""
        ...

    def iter_issues(
        self,
        repo: str,
        state: str = "all",
        labels: Sequence[str] | None = None,
        since: str | datetime | None = None,
    ) -> AsyncIterator[JSON]:
        """All issues (pull requests excluded), paginated; ``labels`` are ANDed (GitHub)."""
        ...

    async def find_issue(self, repo: str, marker: str,
                         accept: Callable[[JSON], bool] | None = None) -> JSON | None:
        """A recent issue by the app whose body contains `marker` (did a create land?), and
        that `accept` takes: the app opens issues whose bodies others wrote (every mail), so
        a marker found in one may be in their words."""
        ...

    async def marked_issues(self, repo: str, marker: str) -> list[JSON]:
        """The app's recent open issues whose body contains `marker`, oldest first (more
        than one only when writers of one issue raced: `bot.forge.once.issue_once`)."""
        ...

    async def search_issues(self, q: str) -> list[JSON]: ...

    # labels
    async def add_labels(self, repo: str, number: int, labels: Sequence[str]) -> list[JSON]: ...

    async def remove_label(self, repo: str, number: int, name: str) -> bool: ...

    async def set_labels(self, repo: str, number: int, labels: Sequence[str]) -> list[JSON]: ...

    async def ensure_labels(self, repo: str, labels: Sequence[Label]) -> Mapping[str, list[str]]:
        """Create missing labels and fix wrong colours/descriptions; returns
        ``{"created": [...], "updated": [...]}`` (both empty when nothing was written)."""
        ...

    # comments
    async def create_comment(
        self, repo: str, number: int, body: str, marker: str | None = None
    ) -> JSON: ...

    async def find_comment(self, repo: str, number: int, marker: str) -> JSON | None:
        """A recent comment by the app on the issue whose body contains `marker`."""
        ...

    async def keep_first(self, repo: str, number: int, marker: str) -> JSON | None:
        """Delete the app's later comments carrying `marker`, keeping the first (returned;
        None when there is none)."""
        ...

    async def delete_comment(self, repo: str, comment_id: int) -> bool: ...

    async def update_comment(self, repo: str, comment_id: int, body: str) -> JSON: ...

    async def get_comment(self, repo: str, comment_id: int) -> JSON: ...

    async def list_comments(
        self, repo: str, number: int, since: str | datetime | None = None
    ) -> list[JSON]: ...

    # repository
    async def permission(self, repo: str, login: str) -> str:
        """The user's role on the repository: admin|maintain|write|triage|read|none."""
        ...

    async def get_file(self, repo: str, path: str, *, at_most: int | None = None) -> str | None:
        """The text of the file at `path` on the default branch; None when there is none.
        `at_most`: the most bytes it may be; FileTooLarge past it, its answer not read
        beyond what a file that size takes (`contents_at_most`)."""
        ...

    async def file_info(self, repo: str, path: str) -> JSON | None:
        """The contents API's description of a file on the default branch (``sha``: its git
        blob sha, ``size``, ``html_url``), whatever its bytes; None when there is none."""
        ...

    async def put_file(self, repo: str, path: str, content: bytes, message: str,
                       sha: str | None = None) -> JSON:
        """Commit `content` at `path` on the default branch through the contents API: a new
        file, or (given the blob `sha` it has now) a replaced one. Returns the file as
        `file_info` describes it; after an ambiguous failure a file already there with these
        bytes is the answer."""
        ...

    async def dispatch(
        self, repo: str, event_type: str, client_payload: Mapping[str, Any]
    ) -> None: ...

    def save_etag_cache(self, path: Path) -> None:
        """Keep the conditional-read cache for the next process (CLI runs)."""
        ...

    def load_etag_cache(self, path: Path) -> None: ...

    async def list_installation_repos(self) -> list[str]: ...

    async def repo_name_now(self, repo: str) -> str | None:
        """The full name (lower case) of the repository the forge answers `repo` with: its
        new name when it was renamed (the old name leads to it), None when there is none."""
        ...

    async def repo_name_of(self, repo_id: int) -> str | None:
        """The full name now (lower case) of the repository with the forge id `repo_id`
        (a payload's `repository.id`), None when there is none."""
        ...

    async def repo_closed(self, repo: str) -> Literal["gone", "archived"] | None:
        """Whether `repo` takes no writes: `gone` (none), `archived` (read-only); None when
        it takes them (or was moved: its writes then say)."""
        ...


__all__ = ["JSON", "Forge", "blob_sha"]


def contents_route(path: str) -> str:
    """The contents API's route for `path` in a repository (both forges say it alike)."""
    return "/repos/{owner}/{repo}/contents/" + quote(path.lstrip("/"), safe="/")


def file_or_none(data: Any) -> JSON | None:
    """A contents answer, if it is one file (not a directory listing, a link or a module)."""
    return data if isinstance(data, dict) and data.get("type", "file") == "file" else None


def contents_at_most(at_most: int | None) -> int | None:
    """The most bytes a contents answer of a file of `at_most` bytes takes: its base64 (4/3,
    GitHub's with a newline, two characters in JSON, every 60) and its links."""
    return None if at_most is None else at_most * 3 // 2 + 64 * 1024


def too_large(path: str, at_most: int) -> FileTooLarge:
    return FileTooLarge(f"{path}: more than {at_most:,} bytes", at_most=at_most, method="GET",
                        url=path)


def file_text(path: str, data: JSON, at_most: int | None = None) -> str:
    """A contents answer's file as UTF-8 text; UnreadableFile when it cannot be read as such,
    FileTooLarge when it is over `at_most` bytes (its `size` looked at before decoding)."""
    size = data.get("size")
    if at_most is not None and isinstance(size, int) and size > at_most:
        raise too_large(path, at_most)
    raw = data.get("content")
    if data.get("encoding") != "base64" or not isinstance(raw, str):  # (GitHub: over 1 MB)
        raise UnreadableFile(f"{path}: unsupported content encoding {data.get('encoding')!r}"
                             " (a file over 1 MB, or not a file)", method="GET", url=path)
    try:
        decoded = base64.b64decode(raw)
        if at_most is not None and len(decoded) > at_most:  # (whatever its `size` said)
            raise too_large(path, at_most)
        return decoded.decode("utf-8")
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise UnreadableFile(f"{path}: cannot decode content: {exc}", method="GET",
                             url=path) from exc


def file_meta(data: JSON) -> JSON:
    """A contents answer's file without its bytes (its sha, size, links)."""
    return {k: v for k, v in data.items() if k not in ("content", "encoding")}


def blob_sha(content: bytes) -> str:
    """A file's git blob sha, as the contents API names a file's version."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


async def probe(session: aiohttp.ClientSession, url: str, timeout: float = 5.0) -> int:
    """Readiness: the status the forge answers `url` with, unauthenticated. Any answer below
    500 means it is up; a 5xx or no answer raises, saying which."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            if resp.status >= 500:
                raise ConnectionError(f"{url} answered {resp.status}")
            return resp.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ConnectionError(f"{url} unreachable: {exc!r}") from exc
