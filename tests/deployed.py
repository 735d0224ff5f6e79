"""The set-up of a deployed vaultmail against the local forge: the forge with the example
office and its config, and the App registered (its key, webhook secret and id), as an operator
would have them before starting `vaultmail serve` (tests/test_kill.py, tests/test_replicas.py)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from importlib import resources

from bot.app.embedded import APP_EVENTS, APP_PERMISSIONS, APP_SLUG
from bot.office.config import load_office
from bot.office.seed import seed_office
from bot.office.source import CONFIG_PATH, CONFIG_REPO
from localforge import LocalForge
from tests.support import app_key


@dataclass
class Deployed:
    forge: LocalForge
    org: str
    tokens: dict[str, str]  # the office's people and agents on the forge
    app_id: int
    pem: str  # the App's private key
    secret: str  # its webhook secret

    def env(self, data_dir: str) -> dict[str, str]:
        """What `vaultmail serve` is given (PRIVATE_KEY inline; no port yet)."""
        return {"GITHUB_API_URL": self.forge.url, "GITHUB_APP_ID": str(self.app_id),
                "PRIVATE_KEY": self.pem.replace("\n", "\\n"),
                "GITHUB_WEBHOOK_SECRET": self.secret, "VAULTMAIL_DATA": data_dir,
                "HOST": "127.0.0.1", "VAULTMAIL_RECONCILE_SECONDS": "0.5"}

    def install(self) -> None:
        """Install the App on the office's org (its webhook may fail: reconciliation
        brings it)."""
        self.forge.install_app(self.app_id, self.org)


async def deploy(webhook_url: str) -> Deployed:
    """A started forge with the example office, and vaultmail registered, not installed."""
    office = load_office()
    forge = LocalForge()
    await forge.start()
    tokens = seed_office(forge, office)
    forge.put_file(f"{office.org}/{CONFIG_REPO}", CONFIG_PATH,
                   resources.files("bot").joinpath("example_office.yml").read_text())
    pem, secret = app_key(), secrets.token_hex(20)
    app_id = forge.register_app(slug=APP_SLUG, name="vaultmail", public_key_pem=pem,
                                webhook_url=webhook_url, webhook_secret=secret,
                                events=APP_EVENTS, permissions=APP_PERMISSIONS)
    return Deployed(forge, office.org, tokens, app_id, pem, secret)
