"""The app's account on a Gitea forge: a plain bot user with a token, an owner of the org (as
creating org webhooks and reading others' repository permissions require), and an org webhook
pointed at the app, in place of GitHub's App registration and installation."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .events import add_org_hook

if TYPE_CHECKING:
    from ..forge import LocalForge

BOT_EVENTS = ["issues", "issue_comment", "push"]


def add_bot(forge: LocalForge, org: str, login: str, webhook_url: str | None = None,
            webhook_secret: str | None = None,
            events: list[str] | None = None) -> tuple[str, int | None]:
    """Create the bot user (org owner) and, with a URL, its org webhook.
    Returns (the bot's token, the hook id or None)."""
    token = forge.user_token(login)
    forge.add_org_member(org, login, role="admin")
    hook_id = None
    if webhook_url is not None:
        hook_id = add_org_hook(forge, org, webhook_url, webhook_secret,
                               list(events or BOT_EVENTS)).hook_id
    return token, hook_id


def make_site_admin(forge: LocalForge, login: str) -> None:
    """Make `login` an administrator of the Gitea instance (Gitea's `is_admin`)."""
    acct = forge.state.account(login)
    if acct is None or acct.type != "User":
        raise KeyError(f"no user {login!r}")
    acct.site_admin = True
    forge.save()
