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
from bot.store import api_tokens, ledger
from bot.tools.http import members

router = Router()


def _touches_config(data: dict[str, object]) -> bool:
    commits = data.get("commits") or []
    assert isinstance(commits, list)
    return any(CONFIG_PATH in (c.get(k) or []) for c in commits
               for k in ("added", "modified", "removed"))


async def _revoke_removed(ctx: HandlerContext, org: str, removed: set[str]) -> None:
    """Whoever the new config removed loses their API tokens in this office now (added back,
    they get new ones), so no token outlives its holder's place in the office."""
    for principal in sorted(removed):
        revoked = await api_tokens.revoke_principal(ctx.services.store, principal, org)
        ctx.log.info("removed from the office: tokens revoked",
                     extra={"org": org, "principal": principal, "revoked": revoked})


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
    before = await offices.get(ctx.forge, org)
    office = await offices.get(ctx.forge, org, fresh=True)
    error = offices.last_error.get(org)
    if error is None:
        ctx.log.info("office config reloaded", extra={"org": org})
        if before is not None and office is not None:
            await _revoke_removed(ctx, org, members(before) - members(office))
        return
    pusher = data.get("sender", {}).get("login", "")
    kept = "the last valid config stays in force" if office else "no config is in force yet"
    body = (f"@{pusher} the push to `{CONFIG_PATH}` was refused; {kept}.\n\n"
            + "\n".join(f"- {defuse_mentions(line)}" for line in error.errors)
            + "\n\nFix these and push again.")
    await ctx.forge.create_issue(f"{org}/{CONFIG_REPO}", f"{CONFIG_PATH} was refused", body,
                                 labels=[])
    await ledger.record(ctx.services.store, "office.config_refused", f"forge:{pusher}",
                        f"{org}/{CONFIG_REPO}", {"errors": error.errors}, org=org)
