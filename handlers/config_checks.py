"""A pull request that changes the org's `.github/vaultmail.yml` is checked before it is merged
(issue 23, as Mergify and Renovate check their configs): the file at the pull request's head is
validated exactly as a push of it is (`OfficeSource.validate`: the same errors, each with its
key, line and column), and the result is a check run "vaultmail config" on the head commit
(GitHub: success or failure, one annotation an error at its line and column, a summary saying
what to fix) or, on Gitea, a commit status of that name. Anyone may open a pull request
on a public `.github`, so one check reports at most its first 50 errors (one write: GitHub
takes 50 annotations a request), each message cut to 400 characters, and says how many more
there are: fixing these first shows the next. Opened, reopened and each push to the
branch (`synchronize`; Gitea says `synchronized`) check it again. A pull request elsewhere, or
one that leaves the config alone (or removes it), gets nothing.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from gidgethub import sansio

from bot.app.context import HandlerContext
from bot.app.routing import OrderedRouter
from bot.forge.errors import PermissionDenied
from bot.forge.github import MAX_ANNOTATIONS
from bot.mail.markdown import as_data
from bot.office.config import MAX_CONFIG_BYTES, OfficeConfigError, shortened
from bot.office.source import CONFIG_PATH, CONFIG_REPO, config_text

router = OrderedRouter()
CHECK_NAME = "vaultmail config"
ACTIONS = ("opened", "reopened", "synchronize", "synchronized")
_AT = re.compile(r" \(line (\d+), column (\d+)\)$")
SHOWN = MAX_ANNOTATIONS  # errors one check reports: GitHub's annotations a request (one write)


@runtime_checkable
class ChecksForge(Protocol):
    """What a forge offers for this check (bot/forge/github.py: a check run; gitea.py: a
    commit status)."""

    async def pull_files(self, repo: str, number: int) -> list[dict[str, Any]]: ...

    async def get_file_at(self, repo: str, path: str, ref: str, *,
                          at_most: int | None = None) -> str | None: ...

    async def report_check(self, repo: str, head_sha: str, name: str, ok: bool, title: str,
                           summary: str, annotations: Sequence[dict[str, Any]] = ()
                           ) -> dict[str, Any]: ...


def annotation(error: str, source: str) -> dict[str, Any]:
    """One error (`source: key: why (line L, column C)`) as a check run's annotation at its
    line and column (an error the file cannot place: line 1), cut to 400 characters."""
    message = shortened(error.removeprefix(f"{source}: "))
    found = _AT.search(message)
    line, column = (int(found[1]), int(found[2])) if found else (1, None)
    out: dict[str, Any] = {"path": CONFIG_PATH, "start_line": line, "end_line": line,
                           "annotation_level": "failure", "title": CONFIG_PATH,
                           "message": _AT.sub("", message)}
    if column is not None:
        out["start_column"] = out["end_column"] = column
    return out


@router.register("pull_request")
async def check_config_pull_request(event: sansio.Event, ctx: HandlerContext) -> None:
    try:
        await _check(event.data, ctx)
    except PermissionDenied as exc:
        # an App registered before app.yml asked for Checks: write / Pull requests: read,
        # its new permissions not yet accepted: nothing to retry until they are
        ctx.log.warning("pull request not checked: the app lacks a permission for it (%s); "
                        "raise Checks: write and Pull requests: read and accept them", exc)


async def _check(data: dict[str, Any], ctx: HandlerContext) -> None:
    repo = data.get("repository") or {}
    pull = data.get("pull_request") or {}
    if data.get("action") not in ACTIONS or repo.get("name") != CONFIG_REPO:
        return
    forge = ctx.forge
    if not isinstance(forge, ChecksForge):
        ctx.log.info("this forge cannot report checks: pull request not checked")
        return
    org = str((repo.get("owner") or {}).get("login", ""))
    full_name = f"{org}/{CONFIG_REPO}"
    number = int(data.get("number") or pull.get("number") or 0)
    head_sha = str((pull.get("head") or {}).get("sha") or "")
    if not org or not number or not head_sha:
        return
    files = await forge.pull_files(full_name, number)
    if not any(f.get("filename") == CONFIG_PATH and f.get("status") != "removed"
               for f in files):
        return
    offices = ctx.services.offices
    short = head_sha[:12]
    # (anyone's pull request: read bounded, parsed beside the loop, which serves every office)
    try:
        text = await config_text(forge.get_file_at(full_name, CONFIG_PATH, head_sha,
                                                   at_most=MAX_CONFIG_BYTES), offices.where(org))
        if text is None:
            return
        await asyncio.to_thread(offices.validate, org, text)
    except OfficeConfigError as exc:
        source = offices.where(org)
        # (bounded: GitHub takes a summary of 65,535 characters, 50 annotations a request)
        notes = [annotation(e, source) for e in exc.errors[:SHOWN]]
        total, more = len(exc.errors), len(exc.errors) - len(notes)
        count = f"{total} error{'s' if total != 1 else ''}"
        summary = (f"`{CONFIG_PATH}` at {short} would be refused if merged ({count}); the "
                   "last valid config would stay in force. Fix each of these (the annotations "
                   "mark where) and push again; `vaultmail office check vaultmail.yml` says "
                   "the same before you push.\n\n"
                   + "\n".join(f"- {as_data(n['message'])} (line {n['start_line']}"
                               + (f", column {n['start_column']})" if "start_column" in n
                                  else ")") for n in notes)
                   + (f"\n\n…and {more} more not shown here: fixing these first and pushing "
                      "again shows the next." if more else ""))
        await forge.report_check(full_name, head_sha, CHECK_NAME, False,
                                 f"{CONFIG_PATH} is invalid: {count}", summary, notes)
        ctx.log.info("office config in a pull request refused",
                     extra={"org": org, "pull": number, "error_count": total,
                            "errors": exc.errors[:SHOWN]})
        return
    await forge.report_check(
        full_name, head_sha, CHECK_NAME, True, f"{CONFIG_PATH} is valid",
        f"`{CONFIG_PATH}` at {short} is valid: once merged it is the office's config.")
    ctx.log.info("office config in a pull request valid", extra={"org": org, "pull": number})
