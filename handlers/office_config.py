"""A push that changes the org's `.github/vaultmail.yml` reloads the office config.

An invalid config is refused with every error located, in an issue on the `.github` repository
that mentions the pusher; the last valid config stays in force.
"""

from __future__ import annotations

from gidgethub import sansio
from gidgethub.routing import Router

from bot.app.context import HandlerContext
from bot.mail.markdown import defuse_mentions
from bot.office.source import CONFIG_PATH, CONFIG_REPO
from bot.store import ledger

router = Router()


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
    office = await offices.get(ctx.forge, org, fresh=True)
    error = offices.last_error.get(org)
    if error is None:
        ctx.log.info("office config reloaded", extra={"org": org})
        return
    pusher = data.get("sender", {}).get("login", "")
    kept = "the last valid config stays in force" if office else "no config is in force yet"
    body = (f"@{pusher} the push to `{CONFIG_PATH}` was refused; {kept}.\n\n"
            + "\n".join(f"- {defuse_mentions(line)}" for line in error.errors)
            + "\n\nFix these and push again.")
    await ctx.forge.create_issue(f"{org}/{CONFIG_REPO}", f"{CONFIG_PATH} was refused", body,
                                 labels=[])
    await ledger.record(ctx.services.store, "office.config_refused", f"forge:{pusher}",
                        f"{org}/{CONFIG_REPO}", {"errors": error.errors})
