"""The embedded default: a local forge and the app in one process, seeded from an office.

Used by `vaultmail up`, `vaultmail demo`, the tests and the benchmarks, so all of them run the
same start-up path a newcomer runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import socket
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from bot.app import runs
from bot.app.egress import OutboundPolicy
from bot.app.intake import org_webhook_secret
from bot.app.reconcile import Reconciler
from bot.app.services import SERVICES_KEY, Services
from bot.app.settings import EmailSettings, Settings, commands_setting, outbound_setting
from bot.app.web import CATCH_UP_KEY, RECONCILER_KEY, WORKER_KEY, create_app
from bot.app.worker import Worker
from bot.console.signin import CALLBACK
from bot.email.auth import Resolver
from bot.email.gateway import GATEWAY_KEY, add_email
from bot.email.server import ListenError
from bot.email.server import bind as bind_smtp
from bot.forge.tokens import signing_key
from bot.office.config import (
    PYTHON,
    AgentCommands,
    CommandDispatch,
    Office,
    load_office,
    parse_office,
    repository_form,
)
from bot.office.seed import office_yaml, seed_office
from bot.office.source import CONFIG_PATH, CONFIG_REPO
from bot.private_files import private_dir, write_private
from bot.store import api_tokens, ledger
from localforge import LocalForge

APP_SLUG = "vaultmail"
# installation and installation_repositories always reach an App; it cannot subscribe to them.
APP_EVENTS = ["issues", "issue_comment", "label", "push", "sub_issues",
              "issue_dependencies", "pull_request", "repository"]  # as app.yml
APP_PERMISSIONS = {"issues": "write", "metadata": "read", "contents": "write",
                   "pull_requests": "read", "checks": "write"}
GITEA_EVENTS = ["issues", "issue_comment", "push"]  # "issues" covers issue_label and the like
# The embedded default is its own operator: the example office's echo agent (`dispatch:
# command`) runs the example agent, as VAULTMAIL_AGENT_COMMANDS would say on a deployment
EXAMPLE_COMMANDS = AgentCommands({"acme": {"echo": CommandDispatch(
    command=[PYTHON, "-m", "bot.agents.echo"], timeout=60)}})
# Embedded.settle's looks before it gives up: each waits out what the one before found
SETTLE_ROUNDS = 20


def principals(office: Office) -> list[str]:
    return [h.principal for h in office.humans] + [a.principal for a in office.agents]


@dataclass
class Identity:
    """The App as registered on the local forge; kept in DATA/app.json across restarts."""

    app_id: int
    installation_id: int
    webhook_secret: str
    private_key_pem: str
    dialect: str = "github"
    token: str = ""  # gitea: the bot user's access token
    database_url: str = ""  # the index, when not the SQLite file beside it (PostgreSQL)

    @classmethod
    def load(cls, path: Path) -> Identity | None:
        if not path.exists():
            return None
        return cls(**json.loads(path.read_text()))

    def save(self, path: Path) -> None:
        write_private(path, json.dumps(self.__dict__))  # it holds the App's private key


def new_private_key() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def _public_pem(private_pem: str) -> str:
    return signing_key(private_pem).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


@dataclass
class Embedded:
    forge: LocalForge
    runner: web.AppRunner
    app_url: str
    data_dir: Path
    office: Office
    forge_tokens: dict[str, str]
    api_tokens: dict[str, str] = field(default_factory=dict)
    app_urls: list[str] = field(default_factory=list)  # every replica's (this one's first)

    def spread_webhooks(self) -> None:
        """The forge delivers to every replica in turn, skipping one that is down, as a load
        balancer in front of them would (the App's webhook URL is the first replica's)."""
        self.forge.balance(self.app_url + "/webhook", [u + "/webhook" for u in self.app_urls])

    def write_tokens(self) -> None:
        """tokens.json: where everything is and the tokens to act as anyone in the office."""
        text = json.dumps({
            "forge_url": self.forge.url, "app_url": self.app_url,
            "app_urls": self.app_urls or [self.app_url],
            "forge_tokens": self.forge_tokens, "api_tokens": self.api_tokens}, indent=2)
        # (`up --replicas` writes it again once every replica is up: a reader finds one whole)
        write_private(self.tokens_path, text)

    @property
    def services(self) -> Services:
        return self.runner.app[SERVICES_KEY]

    @property
    def worker(self) -> Worker:
        return self.runner.app[WORKER_KEY]

    @property
    def reconciler(self) -> Reconciler:
        return self.runner.app[RECONCILER_KEY]

    @property
    def smtp_port(self) -> int | None:
        """The SMTP listener's port (`start_embedded(email=...)`), None without one."""
        gateway = self.runner.app.get(GATEWAY_KEY)
        return gateway.port if gateway is not None else None

    @property
    def tokens_path(self) -> Path:
        return self.data_dir / "tokens.json"

    async def settle(self, timeout: float = 30.0) -> None:
        """Wait until every webhook has been delivered and handled (and what they caused,
        run dispatches and local agents' command runs among them). TimeoutError when each of
        SETTLE_ROUNDS looks found more under way (what was caused keeps causing more: a loop)."""
        for _ in range(SETTLE_ROUNDS):
            await self.forge.webhooks_idle()
            await self.worker.idle(timeout)
            await runs.idle(self.services, timeout)
            await self.forge.webhooks_idle()
            if (await self.services.store.pending_count() == 0
                    and not self.services.background):
                return
        raise TimeoutError(f"not settled after {SETTLE_ROUNDS} rounds: each found deliveries "
                           "pending or runs under way that the round before had caused")

    async def vaults_caught_up(self) -> None:
        """Wait until the start's catch-up (the vaults renamed while the app was down, and the
        index with the forge) has gone over every office (it runs beside the start:
        bot.app.doctor.catch_up_at_start)."""
        task = self.runner.app.get(CATCH_UP_KEY)
        if task is not None:
            await asyncio.wait([task])

    async def ledger_events(self, event: str) -> list[ledger.Entry]:
        return await ledger.entries(self.services.store, event=event)

    async def stop(self) -> None:
        await self.runner.cleanup()
        await self.forge.stop()


class PortInUse(Exception):
    """A port `up` needs is taken; the message names it and what to do."""


async def start_embedded(
    *,
    office_path: str | Path | None = None,
    data_dir: Path,
    persist_forge: bool = False,
    host: str = "127.0.0.1",
    port: int = 8080,
    forge_port: int = 8081,
    dialect: str = "github",
    database_url: str = "",
    replica_id: str = "",
    agent_commands: AgentCommands | None = None,
    outbound: OutboundPolicy | None = None,
    email: EmailSettings | None = None,
    resolver: Resolver | None = None,
    app_key: str | None = None,
) -> Embedded:
    """`office_path` is the operator's own file: its `{command: [...]}` dispatches are taken
    as the operator's commands (with EXAMPLE_COMMANDS, VAULTMAIL_AGENT_COMMANDS and
    `agent_commands`), and the forge gets the config as an org would write it. `outbound`: the
    operator's outbound policy (else VAULTMAIL_OUTBOUND_ALLOW's). `email`: real mailboxes
    (the SMTP listener, the relay; bot.email), their DNS lookups by `resolver`. `app_key`:
    the App's private key (PEM) to register on a fresh forge, else a new one (tests share
    one: making a 2048-bit key costs a tenth of a second)."""
    private_dir(data_dir)  # keys, tokens, the index: the app's alone (0700)
    office = load_office(office_path)
    in_repository, file_commands = repository_form(office)
    from_env = commands_setting(os.environ.get("VAULTMAIL_AGENT_COMMANDS"))
    commands = EXAMPLE_COMMANDS.merged(from_env).merged(file_commands).merged(
        agent_commands or AgentCommands())
    if outbound is None:
        outbound = outbound_setting(os.environ.get("VAULTMAIL_OUTBOUND_ALLOW"))
    office_text = _office_text(office_path) if in_repository == office else \
        office_yaml(in_repository)
    # what the app will read back from the forge, refused now rather than found refused there
    parse_office(office_text, str(office_path or "built-in example office"), repository=True,
                 url_refused=outbound.url_refusal_offline)
    # Bind the app's socket before anything is started (a port in use then leaves nothing
    # open), and so the App can be registered with its real webhook URL.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise PortInUse(f"cannot listen on {host}:{port} for the app: {exc.strerror}: stop "
                        "what uses that port or choose another (--port)") from None
    smtp_sock = None
    if email is not None and email.listen_port is not None:
        try:
            smtp_sock = bind_smtp(email.listen_host, email.listen_port)
        except ListenError as exc:
            sock.close()
            raise PortInUse(str(exc)) from None
    # what people open and the forge posts to: a wildcard bind is reached on loopback here
    shown = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "[::1]"}.get(host, host)
    app_url = f"http://{shown}:{sock.getsockname()[1]}"
    forge = LocalForge(dialect=dialect, data_dir=data_dir / "forge" if persist_forge else None)
    try:
        await forge.start(host=host, port=forge_port)
    except OSError as exc:
        sock.close()
        if smtp_sock is not None:
            smtp_sock.close()
        await forge.stop()
        raise PortInUse(f"cannot listen on {host}:{forge_port} for the local forge: "
                        f"{exc.strerror}: stop what uses that port or choose another "
                        "(--forge-port)") from None

    identity_path = data_dir / "app.json"
    tokens_path = data_dir / "tokens.json"
    identity = Identity.load(identity_path) if persist_forge else None
    fresh = identity is None
    if identity is None and dialect == "gitea":
        forge_tokens, identity = _seed_gitea(forge, office, office_text, app_url)
    elif identity is None:
        forge_tokens = seed_office(forge, office)
        forge.put_file(f"{office.org}/{CONFIG_REPO}", CONFIG_PATH, office_text)
        pem = app_key or new_private_key()
        secret = secrets.token_hex(20)
        app_id = forge.register_app(
            slug=APP_SLUG, name="vaultmail", public_key_pem=_public_pem(pem),
            webhook_url=f"{app_url}/webhook", webhook_secret=secret,
            events=APP_EVENTS, permissions=APP_PERMISSIONS)
        identity = Identity(app_id, 0, secret, pem)
    else:
        forge_tokens = json.loads(tokens_path.read_text())["forge_tokens"]

    if database_url:
        identity.database_url = database_url
    client_id = client_secret = ""
    if identity.dialect == "github":  # the console's sign-in: the App's OAuth client
        client_id, client_secret = forge.client_credentials(identity.app_id)
        forge.set_callback_urls(identity.app_id, [app_url + CALLBACK])
    settings = Settings(api_url=forge.url, app_id=str(identity.app_id),
                        private_key_pem=identity.private_key_pem,
                        webhook_secret=identity.webhook_secret, data_dir=data_dir,
                        host=host, port=sock.getsockname()[1], write_interval=0.0,
                        dialect=identity.dialect, token=identity.token,
                        client_id=client_id, client_secret=client_secret, public_url=app_url,
                        token_sign_in=True, database_url=identity.database_url,
                        replica_id=replica_id, agent_commands=commands, outbound=outbound,
                        email=email or EmailSettings())
    app = create_app(settings)
    if email is not None:
        if resolver is None and office.email is not None:
            # the office it seeds is the operator's own (the example, or its file): its
            # email domain proven by a record of the embedded resolver (bot.email.domains)
            from bot.email.dns import SystemResolver, WithRecords
            from bot.email.domains import record_name, record_value

            account = forge.state.accounts[office.org.lower()].id  # (seeded before)
            resolver = WithRecords(SystemResolver(), {
                record_name(office.email.domain): [record_value(account)]})
        add_email(app, email, resolver=resolver, sock=smtp_sock)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.SockSite(runner, sock).start()

    if fresh and identity.dialect == "gitea":
        identity.save(identity_path)  # the org webhook was made while seeding
    elif fresh:
        identity.installation_id = forge.install_app(identity.app_id, office.org)
        identity.save(identity_path)
    elif database_url:
        identity.save(identity_path)
    embedded = Embedded(forge, runner, app_url, data_dir, office, forge_tokens)
    embedded.services.installations[office.org.lower()] = identity.installation_id
    embedded.api_tokens = await _api_tokens(embedded, tokens_path, fresh)
    embedded.write_tokens()
    await embedded.settle()
    return embedded


def _seed_gitea(forge: LocalForge, office: Office, office_text: str,
                app_url: str) -> tuple[dict[str, str], Identity]:
    """Gitea has no Apps: the app is a bot user (an org owner) with a token, and an org
    webhook points at it. Its labels are provisioned by the app at start."""
    from bot.forge.gitea import SYNTHETIC_INSTALLATION_ID
    from localforge.gitea.seed import add_bot

    forge_tokens = seed_office(forge, office)
    forge.put_file(f"{office.org}/{CONFIG_REPO}", CONFIG_PATH, office_text)
    secret = secrets.token_hex(20)
    # the org's own webhook, with the secret made for it from the operator's (`gitea-hook`)
    org_id = forge.state.accounts[office.org.lower()].id  # (seed_office made it)
    token, _ = add_bot(forge, office.org, APP_SLUG, f"{app_url}/webhook/{office.org}",
                       org_webhook_secret(secret, office.org, org_id), events=GITEA_EVENTS)
    return forge_tokens, Identity(0, SYNTHETIC_INSTALLATION_ID, secret, "", dialect="gitea",
                                  token=token)


async def _api_tokens(embedded: Embedded, path: Path, fresh: bool) -> dict[str, str]:
    """tokens.json's API tokens where the index knows them, new ones for the office's other
    principals: after the index was deleted or rebuilt from the forge (which keeps no token),
    the file's tokens were unknown, every call with them 401, until tokens were made by hand."""
    kept: dict[str, str] = {}
    if not fresh and path.exists():
        kept = json.loads(path.read_text()).get("api_tokens", {})
        known = await api_tokens.known_hashes(
            embedded.services.store, {api_tokens.token_hash(t) for t in kept.values()})
        kept = {p: t for p, t in kept.items() if api_tokens.token_hash(t) in known}
    missing = [p for p in principals(embedded.office) if p not in kept]
    if not missing:
        return kept
    return kept | await api_tokens.create_tokens(embedded.services.store, missing,
                                                 embedded.office.org)


def _office_text(office_path: str | Path | None) -> str:
    if office_path is None:
        from importlib import resources

        return resources.files("bot").joinpath("example_office.yml").read_text()
    return Path(office_path).read_text()
