"""Installing the app, or adding repositories to it, provisions the mail labels in every vault;
the app keeps which organisation each installation is for, so tools act through the right one."""

from __future__ import annotations

from typing import Any

from gidgethub import sansio

from bot.app.context import HandlerContext
from bot.app.listing import follow_keys, follow_vault, relist
from bot.app.routing import OrderedRouter
from bot.store import installations
from labels.catalogue import MAIL_LABELS

router = OrderedRouter()


def _is_vault(repo: str, vaults: set[str] | None) -> bool:
    # Without an office config yet, the default vault pattern decides.
    return repo.lower() in vaults if vaults is not None else repo.endswith("-vault")


async def provision_vaults(ctx: HandlerContext, repos: list[str]) -> list[str]:
    """Create or correct the four mail labels in each vault among `repos`; idempotent."""
    done: list[str] = []
    by_org: dict[str, list[str]] = {}
    for repo in repos:
        by_org.setdefault(repo.split("/")[0], []).append(repo)
    for org, names in by_org.items():
        office = await ctx.services.offices.get(ctx.forge, org)
        vaults = {v.lower() for v in office.vaults()} if office else None
        for repo in names:
            if _is_vault(repo, vaults):
                await ctx.forge.ensure_labels(repo, MAIL_LABELS)
                done.append(repo)
    ctx.log.info("labels provisioned", extra={"vaults": done})
    return done


def _names(items: list[dict[str, Any]]) -> list[str]:
    return [str(r["full_name"]) for r in items]


def _account(event: sansio.Event) -> tuple[str, int] | None:
    inst = event.data.get("installation") or {}
    login = (inst.get("account") or {}).get("login")
    return (str(login).lower(), int(inst["id"])) if login and "id" in inst else None


@router.register("installation", action="created")
@router.register("installation", action="unsuspend")
async def remember_installation(event: sansio.Event, ctx: HandlerContext) -> None:
    if (found := _account(event)) is not None:
        org, inst = found
        account = ((event.data.get("installation") or {}).get("account") or {}).get("id")
        account = account if isinstance(account, int) else None
        known = await installations.accounts(ctx.services.store)
        if account is not None and installations.taken_over(known, {org: account}):
            # another account's org of that name: the old office's keys are set aside before
            # the office is (a retry after a crash between the two finds them moved), and the
            # new one signs with a key of its own
            ctx.services.keyring.retire(org, installations.archived_name(org, known[org]))
        moved = await installations.installed(ctx.services.store, org, inst, account)
        if moved is not None:  # its config the old one had is not served to it meanwhile
            ctx.services.offices.forget(org)
            ctx.log.warning("installed by another account than the one the office was "
                            "made for: that office is kept aside, this one starts empty",
                            extra={"org": org, "kept_as": moved, "account_id": account})
        ctx.services.installations[org] = inst
        ctx.log.info("installation added", extra={"org": org})


@router.register("installation_target", action="renamed")
async def follow_org_rename(event: sansio.Event, ctx: HandlerContext) -> None:
    """The org renamed itself (the same account, a new login): its office follows it, keys
    first (`take_listing` does the same when a start finds it renamed)."""
    account = event.data.get("account") or {}
    new, account_id = account.get("login"), account.get("id")
    old = ((event.data.get("changes") or {}).get("login") or {}).get("from")
    inst = (event.data.get("installation") or {}).get("id")
    if not (isinstance(new, str) and isinstance(old, str) and isinstance(account_id, int)
            and isinstance(inst, int)):
        return

    old, new = old.lower(), new.lower()
    store = ctx.services.store
    known = await installations.accounts(store)
    if installations.renamed_in(known, {new: account_id}) != {old: new}:
        return  # followed already (a start saw it first), or not this account's office
    if await installations.held_elsewhere(store, new, account_id):
        # the office under `new` is another account's, still installed: its org was renamed
        # too and that event is not heard yet. The forge's listing says where it went: the
        # rename out of `new` is followed first, then this one (never the office retired)
        taken = await relist(ctx.services)
        ctx.log.info("organisations renamed: their offices follow them",
                     extra={"renamed": taken.renamed})
        return
    follow_keys(ctx.services.keyring, known, old, new)
    if await installations.renamed(store, old, new, account_id):
        for org in (old, new):
            ctx.services.offices.forget(org)
        ctx.services.installations.pop(old, None)
        ctx.services.installations[new] = inst
        ctx.log.info("organisation renamed: its office follows it",
                     extra={"org": new, "was": old})


@router.register("repository", action="renamed")
async def follow_vault_rename(event: sansio.Event, ctx: HandlerContext) -> None:
    """A repository renamed: the index's rows about it (a vault's mail, an item) name it by
    its new name, and what the office signed for it under the old one verifies there
    (`follow_vault`; a start finds those renamed while no app heard: `catch_up_vaults`)."""
    repo = event.data.get("repository") or {}
    new = repo.get("full_name")
    was = (((event.data.get("changes") or {}).get("repository") or {}).get("name")
           or {}).get("from")
    if not isinstance(new, str) or not isinstance(was, str) or "/" not in new:
        return
    org = new.split("/", 1)[0].lower()
    old = f"{org}/{was}".lower()
    await ctx.services.follow_index()  # (its org's install another replica may have heard)
    if old == new.lower() or org not in ctx.services.installations:
        return
    changed = await follow_vault(ctx.services, old, new)
    ctx.log.info("repository renamed: its rows follow it",
                 extra={"org": org, "was": old, "now": new.lower(), "rows": changed})


@router.register("repository", action="transferred")
async def vault_transferred(event: sansio.Event, ctx: HandlerContext) -> None:
    """A repository transferred to an account the App is installed on (GitHub sends
    `repository.transferred` there only). Here it is a repository of its own, even under a
    name a vault renamed had (`_take_old_names`); for the office it left, a vault of its
    gone, not renamed: its rows and keys stay that office's (never followed across owners:
    `follow_vault`; a start finds one transferred while no app heard: `catch_up_vaults`)."""
    repo = event.data.get("repository") or {}
    new, name = repo.get("full_name"), repo.get("name")
    owner = ((event.data.get("changes") or {}).get("owner") or {}).get("from") or {}
    was = (owner.get("organization") or owner.get("user") or {}).get("login")
    if not isinstance(new, str) or "/" not in new:
        return
    _take_old_names(ctx, [new])
    await ctx.services.follow_index()
    if (isinstance(was, str) and isinstance(name, str)
            and was.lower() in ctx.services.installations):
        org = was.lower()
        ctx.services.offices.forget(org)  # (its config's vault is read again: gone)
        ctx.log.warning("a repository transferred to another owner: gone from its office "
                        "(a vault's mail stays in its index)", extra={
                            "org": org, "vault": f"{org}/{name}".lower(), "now": new.lower()})


@router.register("installation", action="deleted")
@router.register("installation", action="suspend")
async def forget_installation(event: sansio.Event, ctx: HandlerContext) -> None:
    if (found := _account(event)) is not None:
        org, inst = found
        # every replica refuses the org from now on (bot.tools.http.make_call), not only this
        await installations.removed(ctx.services.store, org, inst)
        if ctx.services.installations.get(org) == inst:
            del ctx.services.installations[org]
        ctx.services.forge_client.forget(inst)
        ctx.log.info("installation removed", extra={"org": org})


@router.register("installation", action="created")
@router.register("installation", action="new_permissions_accepted")
async def provision_labels_on_install(event: sansio.Event, ctx: HandlerContext) -> None:
    repos = _names(event.data.get("repositories") or [])
    if not repos:
        repos = await ctx.forge.list_installation_repos()
    await provision_vaults(ctx, repos)


@router.register("installation_repositories", action="added")
async def provision_labels_on_repos_added(event: sansio.Event, ctx: HandlerContext) -> None:
    repos = _names(event.data.get("repositories_added") or [])
    _take_old_names(ctx, repos)  # (first: a config naming one names that repository)
    await provision_vaults(ctx, repos)


@router.register("repository", action="created")
async def take_old_name(event: sansio.Event, ctx: HandlerContext) -> None:
    _take_old_names(ctx, _names([event.data.get("repository") or {}]))


def _take_old_names(ctx: HandlerContext, repos: list[str]) -> None:
    """Repositories made under a name a renamed vault had are repositories of their own: the
    old name leads to the renamed vault no more (`Keyrings.vault_name_taken`), and the
    office's config, read again, names the new one by it."""
    for repo in repos:
        if ctx.services.keyring.vault_name_taken(repo):
            ctx.services.offices.forget(repo.split("/", 1)[0].lower())
            ctx.log.info("a new repository under a renamed vault's old name: its own",
                         extra={"repo": repo.lower()})
