"""Configuration of `vaultmail serve` from the environment (Probot-style names)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

USAGE = """\
vaultmail serve needs a forge to talk to. Set, for a GitHub App:
  GITHUB_APP_ID            the App's id
  GITHUB_PRIVATE_KEY_PATH  the App's private key (PEM file)
  GITHUB_WEBHOOK_SECRET    the webhook secret set on the App (mandatory)
  GITHUB_API_URL           optional, for GitHub Enterprise or another forge (default api.github.com)
or, for a Gitea/Forgejo bot user:
  GITEA_URL                the forge's URL (e.g. https://gitea.example.com)
  GITEA_TOKEN              the bot user's access token
  GITEA_WEBHOOK_SECRET     the secret of the org webhook pointed at /webhook (mandatory)
  VAULTMAIL_DATA           optional, where the index lives (default ./vaultmail-data)
To try vaultmail without a forge, run `vaultmail up`: it starts a local forge and the app."""


class SettingsError(ValueError):
    """Configuration that cannot run; the message says what is missing and how to fix it."""


@dataclass(frozen=True)
class Settings:
    api_url: str
    app_id: str
    private_key_pem: str
    webhook_secret: str
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 8080
    office_path: Path | None = None
    # extra seconds between writes per installation. None by default: writes are serialised,
    # and creations are paced by the client's budget of GitHub's 80 a minute and 500 an hour,
    # which lets a burst go as fast as those limits allow (bench.burst)
    write_interval: float = 0.0
    reconcile_interval: float = 300.0  # seconds between looks for failed webhook deliveries
    extra: dict[str, str] = field(default_factory=dict)
    dialect: str = "github"  # github | gitea (Gitea and Forgejo)
    token: str = ""  # gitea: the bot user's access token

    def __post_init__(self) -> None:
        if not self.webhook_secret:
            name = "GITEA_WEBHOOK_SECRET" if self.dialect == "gitea" else "GITHUB_WEBHOOK_SECRET"
            where = "the org webhook" if self.dialect == "gitea" else "the App"
            raise SettingsError(
                f"{name} is empty: vaultmail refuses unsigned webhooks. "
                f"Set the same secret on {where} and in the environment."
            )

    @property
    def db_path(self) -> Path:
        return self.data_dir / "index.sqlite3"

    @classmethod
    def from_data_dir(cls, data_dir: Path) -> Settings:
        """The app as `vaultmail up --data DIR` registered it on its local forge."""
        import json

        identity = json.loads((data_dir / "app.json").read_text())
        forge_url = json.loads((data_dir / "tokens.json").read_text())["forge_url"]
        if identity.get("dialect") == "gitea":
            return cls(api_url=forge_url, app_id="", private_key_pem="",
                       webhook_secret=identity["webhook_secret"], data_dir=data_dir,
                       write_interval=0.0, dialect="gitea", token=identity["token"])
        return cls(api_url=forge_url, app_id=str(identity["app_id"]),
                   private_key_pem=identity["private_key_pem"],
                   webhook_secret=identity["webhook_secret"], data_dir=data_dir,
                   write_interval=0.0)

    @classmethod
    def for_cli(cls, data: str | None) -> Settings:
        """From `--data DIR` of an embedded office when given, else from the environment."""
        if data and (Path(data) / "app.json").exists():
            return cls.from_data_dir(Path(data))
        return cls.from_env()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        if env.get("GITEA_URL") or env.get("GITEA_TOKEN"):
            return cls._gitea_from_env(env)
        missing = [k for k in ("GITHUB_APP_ID", "GITHUB_WEBHOOK_SECRET") if not env.get(k)]
        key_path = env.get("GITHUB_PRIVATE_KEY_PATH")
        if not key_path:
            missing.append("GITHUB_PRIVATE_KEY_PATH")
        if missing:
            raise SettingsError(f"missing {', '.join(missing)}.\n{USAGE}")
        assert key_path is not None
        try:
            pem = Path(key_path).read_text()
        except OSError as exc:
            raise SettingsError(f"GITHUB_PRIVATE_KEY_PATH={key_path}: cannot read: {exc}") from exc
        office = env.get("VAULTMAIL_OFFICE")
        return cls(
            api_url=env.get("GITHUB_API_URL", "https://api.github.com").rstrip("/"),
            app_id=env["GITHUB_APP_ID"],
            private_key_pem=pem,
            webhook_secret=env["GITHUB_WEBHOOK_SECRET"],
            data_dir=Path(env.get("VAULTMAIL_DATA", "vaultmail-data")),
            host=env.get("HOST", "0.0.0.0"),
            port=int(env.get("PORT", "8080")),
            office_path=Path(office) if office else None,
            reconcile_interval=float(env.get("VAULTMAIL_RECONCILE_SECONDS", "300")),
        )

    @classmethod
    def _gitea_from_env(cls, env: Mapping[str, str]) -> Settings:
        missing = [k for k in ("GITEA_URL", "GITEA_TOKEN", "GITEA_WEBHOOK_SECRET")
                   if not env.get(k)]
        if missing:
            raise SettingsError(f"missing {', '.join(missing)}.\n{USAGE}")
        office = env.get("VAULTMAIL_OFFICE")
        return cls(
            api_url=env["GITEA_URL"].rstrip("/"), app_id="", private_key_pem="",
            webhook_secret=env["GITEA_WEBHOOK_SECRET"],
            data_dir=Path(env.get("VAULTMAIL_DATA", "vaultmail-data")),
            host=env.get("HOST", "0.0.0.0"), port=int(env.get("PORT", "8080")),
            office_path=Path(office) if office else None,
            reconcile_interval=float(env.get("VAULTMAIL_RECONCILE_SECONDS", "300")),
            dialect="gitea", token=env["GITEA_TOKEN"],
        )
