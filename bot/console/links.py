"""What `vaultmail up` prints for the console: its URL, and a sign-in link for each person."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import quote

from bot.console.visitor import CONSOLE
from bot.office.config import Office


def console_url(app_url: str) -> str:
    return f"{app_url}{CONSOLE}/"


def sign_in_lines(app_url: str, office: Office, password: Callable[[str], str] | None
                  ) -> list[str]:
    """One line per person of the office: the link that signs them in, and with what. With
    `password` (the local forge's web sign-in) they sign in with their forge account; without
    it (Gitea's dialect: no App, no OAuth client) with their API token from tokens.json."""
    lines = []
    for human in office.humans:
        link = f"{app_url}{CONSOLE}/sign-in?login={quote(human.login, safe='')}"
        how = (f"forge password {password(human.login)}" if password is not None else
               f'API token in tokens.json api_tokens["{human.principal}"]')
        lines.append(f"  sign in as {human.login} ({human.email}): {link}  ({how})")
    return lines
