"""Configuration of `vaultmail serve` from the environment (Probot-style names)."""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from bot.app.egress import OutboundPolicy
from bot.names import org_entry
from bot.office.config import AgentCommands, OfficeConfigError, load_agent_commands

USAGE = """\
vaultmail serve needs a forge to talk to. Set (in the environment or in .env), for a GitHub App
(`vaultmail register` writes these to .env):
  GITHUB_APP_ID or APP_ID  the App's id
  GITHUB_PRIVATE_KEY_PATH or PRIVATE_KEY_PATH   the App's private key (PEM file),
    or PRIVATE_KEY          the key itself
  GITHUB_WEBHOOK_SECRET or WEBHOOK_SECRET       the webhook secret set on the App (mandatory)
  GHE_HOST                 optional, your GitHub Enterprise Server's host (or GITHUB_API_URL)
or, for a Gitea/Forgejo bot user:
  GITEA_URL                the forge's URL (e.g. https://gitea.example.com)
  GITEA_TOKEN              the bot user's access token
  GITEA_WEBHOOK_SECRET     the secret of the org webhook pointed at /webhook (mandatory)
  VAULTMAIL_DATA           optional, where the index lives (default ./vaultmail-data)
To try vaultmail without a forge, run `vaultmail up`: it starts a local forge and the app."""


# what each setting `serve` cannot start without should hold, for the one-line refusal
_WANTED = {
    "GITHUB_APP_ID": "the App's id (APP_ID also works)",
    "GITHUB_WEBHOOK_SECRET": "the webhook secret set on the App (WEBHOOK_SECRET also works)",
    "GITHUB_PRIVATE_KEY_PATH": "the path of the App's private key, a PEM file "
                               "(PRIVATE_KEY_PATH, or PRIVATE_KEY with the key itself)",
    "GITEA_URL": "the forge's URL, e.g. https://gitea.example.com",
    "GITEA_TOKEN": "the bot user's access token",
    "GITEA_WEBHOOK_SECRET": "the secret of the org webhook pointed at /webhook",
}


def _missing(names: list[str]) -> str:
    """One line naming each missing setting and what it should hold."""
    return ("missing " + "; ".join(f"{n} ({_WANTED[n]})" for n in names)
            + ": set it in the environment or in .env (`vaultmail serve --help` lists all)")


class SettingsError(ValueError):
    """Configuration that cannot run; the message says what is missing and how to fix it."""


class NotRegistered(SettingsError):
    """No App credentials at all: `serve` then offers the registration page (as Probot does),
    with what it needs to build it (where to listen, the forge, GH_ORG, the public URL)."""

    def __init__(self, message: str, *, missing: list[str], host: str, port: int,
                 api_url: str, org: str | None, public_url: str | None,
                 env_file: Path | None) -> None:
        super().__init__(message)
        self.missing, self.host, self.port, self.api_url = missing, host, port, api_url
        self.org, self.public_url, self.env_file = org, public_url, env_file


MIB = 1_048_576
# how long an org's webhook secret from before a rotation is still accepted (Gitea), by
# default and at most (VAULTMAIL_WEBHOOK_GRACE_SECONDS)
WEBHOOK_GRACE, WEBHOOK_GRACE_MAX = 3600.0, 7 * 24 * 3600.0
CHATS_WAITING = 1000  # chats waiting in one office at once, by default (VAULTMAIL_CHATS_WAITING)
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class EmailSettings:
    """Real mailboxes (bot/email), the host's alone (never a repository config's): where the
    SMTP listener is (VAULTMAIL_SMTP_HOST, VAULTMAIL_SMTP_PORT; no port, no listener; 0, any
    free one), the relay replies go out through (SMTP_URL), the largest message taken
    (VAULTMAIL_SMTP_MAX_BYTES) and attachment (VAULTMAIL_SMTP_ATTACHMENT_MAX_BYTES), how many
    messages a minute one outside sender may send one agent (VAULTMAIL_SMTP_SENDER_RATE; five
    times it, one authenticated domain's senders together, bot.email.policy.SharedSenderRate)
    and the name the listener greets with."""

    listen_host: str = "127.0.0.1"
    listen_port: int | None = None
    relay_url: str = ""
    max_bytes: int = 10 * MIB
    hostname: str = "vaultmail"
    sender_rate: int = 20  # messages a minute one outside sender may send one agent
    attachment_max_bytes: int = 5 * MIB  # the largest attachment, decoded, committed to a vault
    # seconds from a message's first 4xx (or unreachable relay) until the outbox gives it up
    # as bounced (VAULTMAIL_SMTP_GIVE_UP_SECONDS; 5 days, as a common MTA keeps one)
    give_up_after: float = 5 * 24 * 3600.0
    # STARTTLS on the listener: a PEM certificate (chain) and its key (VAULTMAIL_SMTP_TLS_CERT,
    # VAULTMAIL_SMTP_TLS_KEY); without them the listener offers no STARTTLS
    tls_cert: Path | None = None
    tls_key: Path | None = None
    # email domains the operator vouches for, {domain: org} (VAULTMAIL_SMTP_DOMAINS,
    # `domain=org` pairs): no DNS proof asked of them (bot.email.domains). The org is an
    # account, as in VAULTMAIL_OUTBOUND_ALLOW: `acme#1234`, or `acme` bound to the first
    # account the index recorded under the login (bot.names.Behalf)
    domains: Mapping[str, str] = field(default_factory=dict)

    def vouched_by_login(self, org: str) -> list[str]:
        """The domains vouched for `org` by its login alone (`domain=acme`): those bound to
        the first account the index recorded under the login."""
        return sorted(domain for domain, entry in self.domains.items()
                      if org_entry(entry) == (org.lower(), None))


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
    # VAULTMAIL_DOCTOR_SECONDS: how often the leader looks for writes the forge lost
    # (bot.app.doctor)
    doctor_interval: float = 900.0
    extra: dict[str, str] = field(default_factory=dict)
    dialect: str = "github"  # github | gitea (Gitea and Forgejo)
    token: str = ""  # gitea: the bot user's access token
    log_level: str = "info"
    # the console's sign-in (bot/console): the App's OAuth client (GITHUB_CLIENT_ID and
    # GITHUB_CLIENT_SECRET), the address people reach the app at (VAULTMAIL_PUBLIC_URL: the
    # OAuth callback and Secure cookies; else the request's own), and on the embedded default
    # sign-in with an API token too
    client_id: str = ""
    client_secret: str = ""
    public_url: str = ""
    token_sign_in: bool = False
    # the Origins a browser page may call /mcp from (VAULTMAIL_ALLOWED_ORIGINS); none by default
    allowed_origins: tuple[str, ...] = field(default_factory=lambda: parse_origins(
        os.environ.get("VAULTMAIL_ALLOWED_ORIGINS")))
    # the proxies (an ingress, a load balancer) whose X-Forwarded-For says whom a request is
    # from, and X-Forwarded-Proto and -Host where it was sent to, without a public_url
    # (VAULTMAIL_TRUSTED_PROXIES); none by default: the connecting address is the client
    trusted_proxies: tuple[Network, ...] = field(default_factory=lambda: parse_proxies(
        os.environ.get("VAULTMAIL_TRUSTED_PROXIES")))
    # the index (DATABASE_URL): SQLite in the data directory by default; postgresql://...
    # for several replicas sharing one database
    database_url: str = ""
    replica_id: str = ""  # REPLICA_ID: a replica restarting under its id takes back its work
    # VAULTMAIL_WEBHOOK_READ_SECONDS: a webhook body not sent whole within this is answered 408
    # and its connection closed (the forge sends one in well under a second)
    webhook_read_seconds: float = 20.0
    # VAULTMAIL_WEBHOOK_GRACE_SECONDS: how long after `vaultmail gitea-hook ORG --rotate` the
    # org's secret before is still accepted, so its admins can set the new one (Gitea)
    webhook_grace_seconds: float = field(default_factory=lambda: float(
        os.environ.get("VAULTMAIL_WEBHOOK_GRACE_SECONDS") or WEBHOOK_GRACE))
    # VAULTMAIL_OPERATOR_TOKEN: `Authorization: Bearer <it>` shows /readyz's detail (which
    # installations, what failed and why); without it, /readyz says ready or not only
    operator_token: str = field(
        default_factory=lambda: os.environ.get("VAULTMAIL_OPERATOR_TOKEN", ""))
    # VAULTMAIL_SQLITE_SYNCHRONOUS: what a 2xx promises on SQLite. "normal" (the default):
    # what was answered survives the process crashing, not the host losing power; "full":
    # it survives a power cut too, at the price of an fsync per commit (README, benchmarks)
    # VAULTMAIL_RETENTION_DAYS: how long handled deliveries, idempotency results and the like
    # are kept before the leader prunes them (bot.store.prune; at least 3, GitHub's
    # redelivery window)
    retention_days: float = field(default_factory=lambda: float(
        os.environ.get("VAULTMAIL_RETENTION_DAYS") or 7))
    # VAULTMAIL_CHATS_WAITING: how many chats (each a queued run) may wait for an answer in one
    # office at once, every person's to every agent together (bot.tools.chat_tools)
    chats_waiting: int = field(default_factory=lambda: int(
        os.environ.get("VAULTMAIL_CHATS_WAITING") or CHATS_WAITING))
    sqlite_synchronous: Literal["normal", "full"] = field(
        default_factory=lambda: "full" if os.environ.get(
            "VAULTMAIL_SQLITE_SYNCHRONOUS", "").lower() == "full" else "normal")
    # VAULTMAIL_AGENT_COMMANDS (a YAML file): the program each org's agent with `dispatch:
    # command` runs on this host; the operator's alone, a repository config names none
    agent_commands: AgentCommands = field(default_factory=lambda: commands_setting(
        os.environ.get("VAULTMAIL_AGENT_COMMANDS")))
    # VAULTMAIL_OUTBOUND_ALLOW: the hosts and networks dispatch URLs and office webhooks may
    # reach besides public addresses, each for one org or every org (also read by `up`)
    outbound: OutboundPolicy = field(default_factory=lambda: outbound_setting(
        os.environ.get("VAULTMAIL_OUTBOUND_ALLOW")))
    email: EmailSettings = field(default_factory=EmailSettings)

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

    @property
    def database(self) -> str:
        """Where the index is: DATABASE_URL, else the SQLite file in the data directory."""
        return self.database_url or str(self.db_path)

    @property
    def web_url(self) -> str:
        """The forge's web address (sign-in pages, issue links), from its API's: github.com
        for api.github.com, the host of GitHub Enterprise's /api/v3, else the same URL."""
        if self.api_url.rstrip("/") == "https://api.github.com":
            return "https://github.com"
        return self.api_url.rstrip("/").removesuffix("/api/v3")

    @classmethod
    def from_data_dir(cls, data_dir: Path) -> Settings:
        """The app as `vaultmail up --data DIR` registered it on its local forge."""
        import json

        identity = json.loads((data_dir / "app.json").read_text())
        forge_url = json.loads((data_dir / "tokens.json").read_text())["forge_url"]
        if identity.get("dialect") == "gitea":
            return cls(api_url=forge_url, app_id="", private_key_pem="",
                       webhook_secret=identity["webhook_secret"], data_dir=data_dir,
                       write_interval=0.0, dialect="gitea", token=identity["token"],
                       database_url=identity.get("database_url", ""))
        return cls(api_url=forge_url, app_id=str(identity["app_id"]),
                   private_key_pem=identity["private_key_pem"],
                   webhook_secret=identity["webhook_secret"], data_dir=data_dir,
                   write_interval=0.0, database_url=identity.get("database_url", ""))

    @classmethod
    def for_cli(cls, data: str | None) -> Settings:
        """From `--data DIR` of an embedded office when given, else from the environment."""
        if data and (Path(data) / "app.json").exists():
            return cls.from_data_dir(Path(data))
        return cls.from_env()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None,
                 env_file: str | Path | None = ".env") -> Settings:
        """`vaultmail serve`: the environment, then `.env` (Probot's names or `GITHUB_*`).

        With `env` given, that mapping alone is read (tests, and callers that already hold it).
        """
        source = _EnvFile.read(env, env_file)
        where = _Where(env, env_file)
        if source.gitea_url or source.gitea_token:
            return cls._gitea(source)
        missing = [name for name, value in (("GITHUB_APP_ID", source.app_id),
                                            ("GITHUB_WEBHOOK_SECRET", source.webhook_secret))
                   if not value]
        if not (source.private_key or source.private_key_path):
            missing.append("GITHUB_PRIVATE_KEY_PATH")
        if len(missing) == 3:  # nothing of an App yet: not registered
            raise NotRegistered(
                f"missing {', '.join(missing)}.\n{USAGE}", missing=missing, host=source.host,
                port=source.port, api_url=source.api_base(), org=source.org,
                public_url=source.public_url,
                env_file=Path(env_file) if env is None and env_file is not None else None)
        if missing:
            raise SettingsError(_missing(missing))
        pem = source.private_key
        if pem:
            named = where.named("private_key")
        else:
            assert source.private_key_path is not None
            name, place = where.set_as("private_key_path")
            named = f"{name}={source.private_key_path}{place}"
            try:
                pem = source.private_key_path.read_text()
            except OSError as exc:
                raise SettingsError(f"{named}: cannot read it ({exc.strerror}): give the path "
                                    f"of the App's private key (PEM)") from exc
        pem = pem.replace("\\n", "\n")  # PRIVATE_KEY in one line of .env, as Probot allows
        if "PRIVATE KEY-----" not in pem:
            raise SettingsError(f"{named}: not a PEM private key (no -----BEGIN ... PRIVATE "
                                "KEY----- line): give the key GitHub generated for the App "
                                "(the .pem file from the App's settings page)")
        return cls(
            api_url=source.api_base(), app_id=str(source.app_id), private_key_pem=pem,
            webhook_secret=str(source.webhook_secret),
            client_id=source.client_id or "", client_secret=source.client_secret or "",
            **_hosting(source),
        )

    @classmethod
    def _gitea(cls, source: _EnvFile) -> Settings:
        missing = [name for name, value in (("GITEA_URL", source.gitea_url),
                                            ("GITEA_TOKEN", source.gitea_token),
                                            ("GITEA_WEBHOOK_SECRET", source.gitea_webhook_secret))
                   if not value]
        if missing:
            raise SettingsError(_missing(missing))
        return cls(
            api_url=str(source.gitea_url).rstrip("/"), app_id="", private_key_pem="",
            webhook_secret=str(source.gitea_webhook_secret), dialect="gitea",
            token=str(source.gitea_token), **_hosting(source),
        )


def _hosting(source: _EnvFile) -> dict[str, Any]:
    """The settings every forge's app takes alike: where it runs and keeps its data, and what
    the operator allows it."""
    return {
        "data_dir": source.data, "host": source.host, "port": source.port,
        "office_path": source.office, "reconcile_interval": source.reconcile_seconds,
        "doctor_interval": source.doctor_seconds,
        "log_level": source.log_level, "public_url": (source.public_url or "").rstrip("/"),
        "allowed_origins": parse_origins(source.allowed_origins),
        "trusted_proxies": parse_proxies(source.trusted_proxies),
        "database_url": source.database_url or "", "replica_id": source.replica_id or "",
        "webhook_read_seconds": source.webhook_read_seconds,
        "webhook_grace_seconds": source.webhook_grace_seconds,
        "operator_token": source.operator_token or "",
        "sqlite_synchronous": source.sqlite_synchronous,
        "retention_days": source.retention_days,
        "chats_waiting": source.chats_waiting,
        "agent_commands": commands_setting(source.agent_commands),
        "outbound": outbound_setting(source.outbound_allow),
        "email": EmailSettings(
            listen_host=source.smtp_host or source.host, listen_port=source.smtp_port,
            relay_url=source.smtp_url or "", max_bytes=source.smtp_max_bytes,
            hostname=source.smtp_hostname, sender_rate=source.smtp_sender_rate,
            attachment_max_bytes=source.smtp_attachment_max_bytes,
            give_up_after=source.smtp_give_up_seconds, tls_cert=source.smtp_tls_cert,
            tls_key=source.smtp_tls_key, domains=domains_setting(source.smtp_domains)),
    }


_ORIGIN = re.compile(r"^https?://[^/\s?#]+$")


def parse_origins(text: str | None) -> tuple[str, ...]:
    """VAULTMAIL_ALLOWED_ORIGINS: origins (scheme://host[:port]) separated by commas or spaces."""
    found = tuple(o.rstrip("/") for o in re.split(r"[\s,]+", text or "") if o)
    wrong = [o for o in found if not _ORIGIN.match(o)]
    if wrong:
        raise SettingsError(f"VAULTMAIL_ALLOWED_ORIGINS={text!r}: should be origins like "
                            f"https://app.example.com, separated by commas ({wrong[0]!r} is not "
                            "one)")
    return found


def parse_proxies(text: str | None) -> tuple[Network, ...]:
    """VAULTMAIL_TRUSTED_PROXIES: addresses or networks (10.0.0.0/8, ::1) separated by commas
    or spaces."""
    found = []
    for item in re.split(r"[\s,]+", text or ""):
        if not item:
            continue
        try:
            found.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise SettingsError(
                f"VAULTMAIL_TRUSTED_PROXIES={text!r}: should be addresses or networks like "
                f"10.0.0.0/8, separated by commas ({item!r} is not one)") from None
    return tuple(found)


def commands_setting(path: str | Path | None) -> AgentCommands:
    """VAULTMAIL_AGENT_COMMANDS: the path of a YAML file, `org: {agent slug: {command: [words],
    timeout: seconds}}`; none when unset."""
    if not path:
        return AgentCommands()
    try:
        return load_agent_commands(path)
    except OfficeConfigError as exc:
        raise SettingsError(f"VAULTMAIL_AGENT_COMMANDS={str(path)!r}: " + "; ".join(exc.errors)
                            + " (the file maps org: agent: {command: [words], timeout: "
                              "seconds})") from None


def outbound_setting(text: str | None) -> OutboundPolicy:
    """VAULTMAIL_OUTBOUND_ALLOW: addresses, networks and host names, each for every org or
    for one (acme=10.0.0.5, or acme#1234=10.0.0.5 naming its forge account), separated by
    commas."""
    try:
        return OutboundPolicy.parse(text)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


DOMAINS_SETTING = "VAULTMAIL_SMTP_DOMAINS"


def domains_setting(text: str | None) -> dict[str, str]:
    """VAULTMAIL_SMTP_DOMAINS: `domain=org` pairs separated by commas or spaces, each org by
    its login (`acme`) or with its forge account id (`acme#1234`); {domain: the org so}. A
    pair that is not one stops the start: read otherwise, it vouched for no one, or (an org
    by login) for whoever holds the login."""
    found: dict[str, str] = {}
    for pair in (p for p in re.split(r"[\s,]+", text or "") if p):
        domain, _, org = pair.partition("=")
        entry = org_entry(org)
        if not domain.strip(".") or entry is None:
            raise SettingsError(
                f"{DOMAINS_SETTING}={text!r}: {pair!r} is not domain=org: write each as "
                "mail.acme.example=acme (the org as the forge spells it) or "
                "mail.acme.example=acme#1234 (with its forge account id, a number from 1), "
                "separated by commas or spaces")
        login, account = entry
        found[domain.lower().rstrip(".")] = login if account is None else f"{login}#{account}"
    return found


LogLevel = Literal["debug", "info", "warning", "error", "critical"]
_LEVELS = {"trace": "debug", "warn": "warning", "fatal": "critical"}  # Probot's (pino's) names


def _env(*names: str) -> Any:
    return Field(default=None, validation_alias=AliasChoices(*names))


class _EnvFile(BaseSettings):
    """What `serve` reads, by every name it accepts; validation errors name the variable."""

    model_config = SettingsConfigDict(env_file=".env", extra="ignore", case_sensitive=True,
                                      populate_by_name=False)

    app_id: str | None = _env("GITHUB_APP_ID", "APP_ID")
    private_key: str | None = _env("GITHUB_PRIVATE_KEY", "PRIVATE_KEY")
    private_key_path: Path | None = _env("GITHUB_PRIVATE_KEY_PATH", "PRIVATE_KEY_PATH")
    webhook_secret: str | None = _env("GITHUB_WEBHOOK_SECRET", "WEBHOOK_SECRET")
    api_url: str | None = _env("GITHUB_API_URL")
    ghe_host: str | None = _env("GHE_HOST")
    ghe_protocol: Literal["https", "http"] = Field(
        default="https", validation_alias=AliasChoices("GHE_PROTOCOL"))
    gitea_url: str | None = _env("GITEA_URL")
    gitea_token: str | None = _env("GITEA_TOKEN")
    gitea_webhook_secret: str | None = _env("GITEA_WEBHOOK_SECRET")
    org: str | None = _env("GH_ORG")  # registration: the organisation to register the App for
    data: Path = Field(default=Path("vaultmail-data"),
                       validation_alias=AliasChoices("VAULTMAIL_DATA"))
    office: Path | None = _env("VAULTMAIL_OFFICE")
    host: str = Field(default="0.0.0.0", validation_alias=AliasChoices("HOST"))
    port: int = Field(default=8080, ge=1, le=65535, validation_alias=AliasChoices("PORT"))
    reconcile_seconds: float = Field(default=300.0, gt=0,
                                     validation_alias=AliasChoices("VAULTMAIL_RECONCILE_SECONDS"))
    doctor_seconds: float = Field(default=900.0, gt=0,
                                  validation_alias=AliasChoices("VAULTMAIL_DOCTOR_SECONDS"))
    log_level: LogLevel = Field(default="info", validation_alias=AliasChoices("LOG_LEVEL"))
    client_id: str | None = _env("GITHUB_CLIENT_ID", "CLIENT_ID")
    client_secret: str | None = _env("GITHUB_CLIENT_SECRET", "CLIENT_SECRET")
    public_url: str | None = _env("VAULTMAIL_PUBLIC_URL")
    allowed_origins: str | None = _env("VAULTMAIL_ALLOWED_ORIGINS")
    trusted_proxies: str | None = _env("VAULTMAIL_TRUSTED_PROXIES")
    database_url: str | None = _env("DATABASE_URL")
    replica_id: str | None = _env("REPLICA_ID")
    webhook_read_seconds: float = Field(
        default=20.0, gt=0, validation_alias=AliasChoices("VAULTMAIL_WEBHOOK_READ_SECONDS"))
    webhook_grace_seconds: float = Field(
        default=WEBHOOK_GRACE, ge=0, le=WEBHOOK_GRACE_MAX,
        validation_alias=AliasChoices("VAULTMAIL_WEBHOOK_GRACE_SECONDS"))
    operator_token: str | None = _env("VAULTMAIL_OPERATOR_TOKEN")
    sqlite_synchronous: Literal["normal", "full"] = Field(
        default="normal", validation_alias=AliasChoices("VAULTMAIL_SQLITE_SYNCHRONOUS"))
    retention_days: float = Field(default=7.0, ge=3, le=3650,
                                  validation_alias=AliasChoices("VAULTMAIL_RETENTION_DAYS"))
    chats_waiting: int = Field(default=CHATS_WAITING, ge=1, le=1_000_000,
                               validation_alias=AliasChoices("VAULTMAIL_CHATS_WAITING"))
    agent_commands: Path | None = _env("VAULTMAIL_AGENT_COMMANDS")
    outbound_allow: str | None = _env("VAULTMAIL_OUTBOUND_ALLOW")
    smtp_host: str | None = _env("VAULTMAIL_SMTP_HOST")
    smtp_port: int | None = Field(default=None, ge=0, le=65535,
                                  validation_alias=AliasChoices("VAULTMAIL_SMTP_PORT"))
    smtp_url: str | None = _env("SMTP_URL")
    smtp_max_bytes: int = Field(default=10 * MIB, ge=1024, le=100 * MIB,
                                validation_alias=AliasChoices("VAULTMAIL_SMTP_MAX_BYTES"))
    smtp_attachment_max_bytes: int = Field(
        default=5 * MIB, ge=1, le=100 * MIB,
        validation_alias=AliasChoices("VAULTMAIL_SMTP_ATTACHMENT_MAX_BYTES"))
    smtp_hostname: str = Field(default="vaultmail",
                               validation_alias=AliasChoices("VAULTMAIL_SMTP_HOSTNAME"))
    smtp_sender_rate: int = Field(default=20, ge=1, le=100_000,
                                  validation_alias=AliasChoices("VAULTMAIL_SMTP_SENDER_RATE"))
    smtp_give_up_seconds: float = Field(
        default=5 * 24 * 3600.0, ge=0, validation_alias=AliasChoices(
            "VAULTMAIL_SMTP_GIVE_UP_SECONDS"))
    smtp_tls_cert: Path | None = _env("VAULTMAIL_SMTP_TLS_CERT")
    smtp_tls_key: Path | None = _env("VAULTMAIL_SMTP_TLS_KEY")
    smtp_domains: str | None = _env("VAULTMAIL_SMTP_DOMAINS")

    @field_validator("smtp_url")
    @classmethod
    def _relay(cls, value: str | None) -> str | None:
        if value and not value.startswith(("smtp://", "smtps://", "smtp+starttls://")):
            raise ValueError("smtp://[user:password@]host[:port], smtp+starttls://... or "
                             "smtps://...")
        return value or None

    @field_validator("database_url")
    @classmethod
    def _known_engine(cls, value: str | None) -> str | None:
        if value and not value.startswith(("sqlite://", "postgresql://", "postgres://")):
            raise ValueError("sqlite:///PATH or postgresql://USER@HOST/DB")
        return value or None

    @field_validator("log_level", mode="before")
    @classmethod
    def _probot_levels(cls, value: object) -> object:
        if isinstance(value, str):
            value = value.lower()
            return _LEVELS.get(value, value)
        return value

    @field_validator("app_id")
    @classmethod
    def _numeric_app_id(cls, value: str | None) -> str | None:
        if value is not None and not value.strip().isdigit():
            raise ValueError("the App's numeric id (on the App's settings page)")
        return value.strip() if value is not None else None

    def api_base(self) -> str:
        if self.api_url:
            return self.api_url.rstrip("/")
        if self.ghe_host:  # GitHub Enterprise Server serves the REST API under /api/v3
            return f"{self.ghe_protocol}://{self.ghe_host.strip('/')}/api/v3"
        return "https://api.github.com"

    @classmethod
    def read(cls, env: Mapping[str, str] | None, env_file: str | Path | None) -> _EnvFile:
        try:
            if env is not None:
                return _MappingOnly.model_validate(dict(env))
            return cls(_env_file=env_file)  # type: ignore[call-arg]
        except ValidationError as exc:
            raise SettingsError(_one_line(exc, _Where(env, env_file))) from None


class _MappingOnly(_EnvFile):
    """The same fields read from a given mapping only (no process environment, no .env)."""

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings],
                                   init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


_WANTS = {
    "port": "a port number from 1 to 65535",
    "smtp_port": "a port number from 0 (any free one) to 65535",
    "smtp_max_bytes": "a number of bytes from 1024 to 104857600 (100 MiB)",
    "smtp_sender_rate": "a number of messages a minute from 1 to 100000",
    "smtp_attachment_max_bytes": "a number of bytes from 1 to 104857600 (100 MiB)",
    "reconcile_seconds": "a number of seconds above 0",
    "doctor_seconds": "a number of seconds above 0",
    "webhook_read_seconds": "a number of seconds above 0",
    "webhook_grace_seconds": f"a number of seconds from 0 to {WEBHOOK_GRACE_MAX:.0f} (a week)",
    "sqlite_synchronous": "normal or full",
    "retention_days": "a number of days from 3 (GitHub's redelivery window) to 3650",
    "chats_waiting": "a number of chats from 1 to 1000000",
    "log_level": "one of debug, info, warning, error, critical (or trace, warn, fatal)",
    "ghe_protocol": "https or http",
}


@dataclass(frozen=True)
class _Where:
    """Where `serve` read its settings from (a given mapping, or the environment, then the
    .env file), to name a setting by the name the operator set it under (APP_ID, not
    GITHUB_APP_ID) and say where it was."""

    env: Mapping[str, str] | None
    env_file: str | Path | None

    def set_as(self, field_name: str) -> tuple[str, str]:
        """The name a field was set under, and " (in FILE)" when it came from the .env."""
        info = _EnvFile.model_fields.get(field_name)
        alias = info.validation_alias if info is not None else None
        names = [str(c) for c in alias.choices] if isinstance(alias, AliasChoices) else []
        if not names:
            return field_name, ""
        if self.env is not None:
            return next((n for n in names if n in self.env), names[0]), ""
        found = next((n for n in names if n in os.environ), None)  # the environment wins
        if found is not None:
            return found, ""
        if self.env_file is not None and Path(self.env_file).is_file():
            from dotenv import dotenv_values

            in_file = dotenv_values(self.env_file)
            found = next((n for n in names if n in in_file), None)
            if found is not None:
                return found, f" (in {self.env_file})"
        return names[0], ""

    def named(self, field_name: str) -> str:
        name, where = self.set_as(field_name)
        return name + where


def _one_line(exc: ValidationError, where: _Where) -> str:
    """The first problem as `NAME=value: what it should hold`, under the name the operator
    set (and the .env file, when it came from there): no traceback, nothing else."""
    err = exc.errors()[0]
    loc = str(err["loc"][0]) if err["loc"] else "?"
    field_name = next((f for f, info in _EnvFile.model_fields.items()
                       if isinstance(info.validation_alias, AliasChoices)
                       and loc in info.validation_alias.choices), loc)
    name, place = where.set_as(field_name)
    wants = _WANTS.get(field_name) or str(err.get("msg", "")).removeprefix("Value error, ")
    return f"{name}={err.get('input')!r}{place}: should be {wants}"
