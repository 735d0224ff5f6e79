"""The app's HTTP face: webhook intake, health, published keys, tools."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web
from gidgethub.aiohttp import GitHubAPI

from bot.app.context import context_for
from bot.app.intake import receive_webhook
from bot.app.outbound import LedgerForwarder
from bot.app.reconcile import Reconciler
from bot.app.services import SERVICES_KEY, Services
from bot.app.settings import Settings
from bot.app.worker import Worker
from bot.forge.github import ForgeClient, ForgeConfig
from bot.forge.tokens import AppAuth
from bot.mail.signing import Keyring
from bot.office.config import load_office
from bot.office.source import OfficeSource
from bot.store import Store
from bot.tools.http import add_routes
from bot.tools.mcp_server import add_mcp_routes
from handlers import build_own_router, build_router

log = logging.getLogger("vaultmail.web")


async def healthz(request: web.Request) -> web.Response:
    services = request.app[SERVICES_KEY]
    return web.json_response({
        "status": "ok",
        "app": services.app_slug,
        "queue_pending": await services.store.pending_count(),
        "dead_letters": len(await services.store.dead_letters()),
    })


async def published_keys(request: web.Request) -> web.Response:
    return web.json_response(request.app[SERVICES_KEY].keyring.public_jwks())


async def fetch_app_slug(auth: AppAuth, session: aiohttp.ClientSession, api_url: str) -> str:
    gh = GitHubAPI(session, "vaultmail", base_url=api_url)
    data = await gh.getitem("/app", jwt=auth.app_jwt(), accept="application/vnd.github+json")
    return str(data["slug"])

WORKER_KEY = web.AppKey("worker", Worker)
RECONCILER_KEY = web.AppKey("reconciler", Reconciler)

async def build_services(settings: Settings, session: aiohttp.ClientSession) -> Services:
    if settings.dialect == "gitea":
        return await build_gitea_services(settings, session)
    auth = AppAuth(settings.app_id, settings.private_key_pem, settings.api_url, session)
    slug = await fetch_app_slug(auth, session, settings.api_url)
    config = ForgeConfig(write_interval=settings.write_interval, bot_login=f"{slug}[bot]")
    client = ForgeClient(auth, session, settings.api_url, config=config)
    if settings.office_path is not None:
        load_office(settings.office_path)  # an invalid file stops the start, with every error
    store = await Store.open(settings.db_path)
    services = Services(settings=settings, store=store, forge_client=client,
                        router=build_router(), own_router=build_own_router(), app_slug=slug,
                        offices=OfficeSource(settings.office_path),
                        keyring=Keyring.in_data_dir(settings.data_dir))
    await _adopt_single_installation(services, auth, session)
    return services


async def build_gitea_services(settings: Settings, session: aiohttp.ClientSession) -> Services:
    """Gitea/Forgejo: the bot user's token; one (synthetic) installation covering its orgs."""
    from bot.forge.gitea import SYNTHETIC_INSTALLATION_ID, GiteaClient

    probe = GiteaClient(settings.token, session, settings.api_url)
    login = await probe.whoami()
    config = ForgeConfig(write_interval=settings.write_interval, bot_login=login)
    client = GiteaClient(settings.token, session, settings.api_url, bot_login=login,
                         config=config)
    if settings.office_path is not None:
        load_office(settings.office_path)
    store = await Store.open(settings.db_path)
    services = Services(settings=settings, store=store, forge_client=client,
                        router=build_router(), own_router=build_own_router(), app_slug=login,
                        offices=OfficeSource(settings.office_path),
                        keyring=Keyring.in_data_dir(settings.data_dir), bot_user=login,
                        default_installation=SYNTHETIC_INSTALLATION_ID)
    orgs = await client.installation().user_orgs()
    if len(orgs) == 1:
        services.default_org = orgs[0]
    return services


def build_worker(services: Services) -> Worker:
    worker = Worker(services.store, services.router, services.own_router,
                    services.is_own_event, lambda item, log: context_for(services, item, log))
    services.wake_worker = worker.wake
    return worker


async def _provision_at_start(services: Services) -> None:
    """Gitea sends no installation event: queue a synthetic one, so the installation handler
    provisions the mail labels in every vault, as on GitHub."""
    from bot.forge import gitea_events as gitea

    guid, event, payload = gitea.startup_delivery()
    if await services.store.enqueue_delivery(guid, event, payload, gitea.encode(payload)):
        services.wake_worker()


async def _adopt_single_installation(services: Services, auth: AppAuth,
                                     session: aiohttp.ClientSession) -> None:
    """With one installation (the usual case) the tools act in its org without being told."""
    gh = GitHubAPI(session, "vaultmail", base_url=services.settings.api_url)
    installs = await gh.getitem("/app/installations", jwt=auth.app_jwt(),
                                accept="application/vnd.github+json")
    if len(installs) == 1:
        services.default_installation = int(installs[0]["id"])
        services.default_org = str(installs[0]["account"]["login"])


def create_app(settings: Settings) -> web.Application:
    """The aiohttp application; services start and stop with it (graceful drain on stop)."""
    app = web.Application()

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        async with aiohttp.ClientSession() as session:
            services = await build_services(settings, session)
            app[SERVICES_KEY] = services
            worker = app[WORKER_KEY] = build_worker(services)
            reconciler = app[RECONCILER_KEY] = Reconciler(
                services.store, services.forge_client.app, settings.reconcile_interval)
            worker.start()
            if settings.dialect == "gitea":
                await _provision_at_start(services)
            forwarder = LedgerForwarder(services)
            forwarder.start()
            reconciler.start()
            log.info("app started", extra={"app": services.app_slug, "api": settings.api_url})
            yield
            await reconciler.stop()
            await forwarder.stop()
            await worker.stop()
            await services.store.close()

    app.cleanup_ctx.append(lifecycle)
    app.router.add_post("/webhook", receive_webhook)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/.well-known/vaultmail-keys.json", published_keys)
    add_routes(app)
    add_mcp_routes(app)
    return app
