"""A push that changes the org's `.github/vaultmail.yml` reloads the office config.

An invalid config is refused, and the last valid one stays in force. As Renovate's "Fix
configuration" issue does, the org has one open issue on its `.github` repository that says
so: opened at the first bad push, its body rewritten at each further one (every error with its
key, line and column, and who pushed which commit), and closed with a comment once a valid
config lands. The issue is found again by a marker in its body and its author, the app; it is
opened through `issue_once` (fenced; a second that lands late is closed as its duplicate), and
the closing comment through `HandlerContext.post_once` (a retried push says it once).
"""

from __future__ import annotations

from typing import Any

from gidgethub import sansio

from bot.app.context import HandlerContext
from bot.app.routing import OrderedRouter
from bot.forge.once import issue_once
from bot.mail.markdown import as_data
from bot.office.config import shortened
from bot.office.source import CONFIG_PATH, CONFIG_REPO
from bot.store import ledger
from handlers.config_checks import SHOWN

router = OrderedRouter()
MARKER = "<!-- vaultmail:office-config-error -->"
TITLE = f"{CONFIG_PATH} was refused"


def _touches_config(data: dict[str, object]) -> bool:
    commits = data.get("commits") or []
    assert isinstance(commits, list)
    return any(CONFIG_PATH in (c.get(k) or []) for c in commits
               for k in ("added", "modified", "removed"))


@router.register("push")
async def reload_office_config(event: sansio.Event, ctx: HandlerContext) -> None:
    data = event.data
    repo = data["repository"]
    if repo["name"] != CONFIG_REPO or not _touches_config(data):
        return
    if data.get("ref") != f"refs/heads/{repo.get('default_branch', 'main')}":
        return
    org = repo["owner"]["login"]
    offices = ctx.services.offices
    # (whoever it no longer names loses their tokens as it is read: Services._config_taken)
    office = await offices.get(ctx.forge, org, fresh=True)
    error = offices.last_error.get(org)
    pusher = data.get("sender", {}).get("login", "")
    # the app's own: a push no one is named for (an org's webhook on Gitea: bot.app.org_signed)
    anonymous = pusher.lower() == ctx.services.bot_login.lower()
    pushed = f"`{CONFIG_PATH}` was pushed" if anonymous else f"@{pusher} pushed `{CONFIG_PATH}`"
    commit = str(data.get("after") or "")[:12]
    async with ctx.services.lock_for(f"office-config:{org.lower()}"):
        if error is None:
            ctx.log.info("office config reloaded", extra={"org": org})
            if (issue := await _open_config_issue(ctx, org)) is not None:
                await _close_fixed(ctx, org, issue, pushed, commit)
            return
        # (the first errors only: an issue body is at most 65,536 characters on GitHub)
        more = len(error.errors) - SHOWN
        kept = "the last valid config stays in force" if office else \
            "no config is in force yet"
        body = (f"{MARKER}\n{pushed} ({commit or 'a commit'}); it was "
                f"refused and {kept}.\n\n"
                + "\n".join(f"- {as_data(shortened(line))}" for line in error.errors[:SHOWN])
                + (f"\n\n…and {more} more not shown here." if more > 0 else "")
                + f"\n\nFix these and push again (`vaultmail office check {CONFIG_PATH}` "
                "says the same before you push). This issue is updated at each refused push "
                "and closed when a valid config lands.")
        repo_name = f"{org}/{CONFIG_REPO}"
        # opened once: a try taken over (the lock lost with its replica) may land its create
        # after the retry's (the later closed as a duplicate)
        issue = await issue_once(ctx.forge, repo_name, TITLE, body, MARKER,
                                 find=lambda: _open_config_issue(ctx, org))
        if issue.get("body") != body:
            await ctx.forge.update_issue(repo_name, int(issue["number"]), body=body)
    await ledger.record(ctx.services.store, "office.config_refused",
                        "office" if anonymous else f"forge:{pusher}",
                        f"{org}/{CONFIG_REPO}", {"errors": [shortened(e) for e in
                                                            error.errors[:SHOWN]],
                                                 "count": len(error.errors)}, org=org)


async def _open_config_issue(ctx: HandlerContext, org: str) -> dict[str, Any] | None:
    """The org's open config-error issue, the app's own (a marker copied into someone else's
    issue is not it)."""
    async for issue in ctx.forge.iter_issues(f"{org}/{CONFIG_REPO}", state="open"):
        author = str((issue.get("user") or {}).get("login", ""))
        if MARKER in (issue.get("body") or "") and \
                author.lower() == ctx.services.bot_login.lower():
            return issue
    return None


async def _close_fixed(ctx: HandlerContext, org: str, issue: dict[str, Any], pushed: str,
                       commit: str) -> None:
    """`pushed`: "@login pushed `vaultmail.yml`", or "`vaultmail.yml` was pushed" (no one
    named)."""
    repo_name, number = f"{org}/{CONFIG_REPO}", int(issue["number"])
    # said once: a retry (the close failed after it) finds it by its marker
    mark = ctx.next_marker()
    await ctx.post_once(repo_name, number, (
        f"{pushed} ({commit or 'a commit'}), valid: it is in force now. Closing.\n\n{mark}"),
        mark)
    await ctx.forge.update_issue(repo_name, number, state="closed", state_reason="completed")
    ctx.log.info("office config fixed: its error issue closed",
                 extra={"org": org, "issue": number})
