"""The app's HTTP face: webhook intake, health, published keys, tools."""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler
from gidgethub import GitHubException

from bot import metrics
from bot.app import runs
from bot.app.bodies import json_response
from bot.app.build import build_services
from bot.app.context import context_for
from bot.app.doctor import DoctorSchedule, catch_up_at_start
from bot.app.gitea_orgs import GiteaOrgs
from bot.app.intake import receive_webhook
from bot.app.outbound import LedgerForwarder
from bot.app.prune import Pruner
from bot.app.reconcile import Reconciler
from bot.app.replica import Presence
from bot.app.services import SERVICES_KEY, Services
from bot.app.settings import Settings
from bot.app.worker import Worker
from bot.console import add_console_routes
from bot.errors import retry_headers
from bot.forge.errors import ForgeError
from bot.forge.pacing import budget_waits
from bot.mail.signing import KeyringError, office_name
from bot.office.config import load_office
from bot.store import health, offices
from bot.store.budget import Limits, SharedWriteBudget
from bot.tools.http import add_routes
from bot.tools.mcp_server import add_mcp_routes

log = logging.getLogger("vaultmail.web")


async def healthz(request: web.Request) -> web.Response:
    """Liveness: the process answers (also while it waits for the forge at start). How much
    is queued, and why the start waits, are every office's together: with an operator's
    token set, the operator's only (anyone else's probe costs no read of the index)."""
    startup = request.app[STARTUP_KEY]
    services = startup.services
    settings = services.settings if services is not None else startup.settings
    shown = _operator_sees(request, settings)
    if services is None:
        return json_response({"status": "starting", "error": startup.error} if shown
                             else {"status": "starting", "detail": OPERATOR_ONLY})
    if not shown:
        return json_response({"status": "ok", "app": services.app_slug,
                                  "detail": OPERATOR_ONLY})
    stats = await services.store.queue_stats()  # two index reads, not every dead letter
    return json_response({
        "status": "ok",
        "app": services.app_slug,
        "queue_pending": int(stats["pending"]),
        "dead_letters": int(stats["dead"]),
    })


STUCK_AFTER = 300.0  # seconds the oldest due delivery may wait before the queue counts as stuck
WRITE_LOCK_WAIT = 1.0  # seconds readiness waits for the index's write lock
BUDGET_WAIT_SHOWN = 5.0  # seconds of waiting for the forge's write budget /readyz tells of


OPERATOR_ONLY = ("each check's detail is shown to the operator only: send Authorization: "
                 "Bearer <VAULTMAIL_OPERATOR_TOKEN>")


def _from_operator(request: web.Request, settings: Settings) -> bool:
    """Whether the request carries the operator's token (none set: nobody is the operator)."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return (bool(settings.operator_token) and scheme.lower() == "bearer"
            and hmac.compare_digest(token.strip().encode(), settings.operator_token.encode()))


def _operator_sees(request: web.Request, settings: Settings) -> bool:
    """Whether what is every office's (counts, why the start waits) is shown to this request:
    the operator's, or anyone's while no operator's token is set."""
    return not settings.operator_token or _from_operator(request, settings)


def _readiness(request: web.Request, startup: Startup,
               checks: dict[str, dict[str, object]]) -> web.Response:
    """200 or 503 with the names of the checks that failed, to anyone; what each check found
    (installations name the tenants) to the operator only. A 503 says when a look again
    makes sense (`Startup.retry_in`)."""
    settings = startup.services.settings if startup.services is not None else startup.settings
    failed = [name for name, c in checks.items() if not c["ok"]]
    body: dict[str, object] = {"status": "not ready" if failed else "ready", "failed": failed}
    if _from_operator(request, settings):
        body["checks"] = checks
    else:
        body["detail"] = OPERATOR_ONLY
    return json_response(body, status=503 if failed else 200,
                         headers=retry_headers(503, startup.retry_in()) if failed else None)


async def readyz(request: web.Request) -> web.Response:
    """Readiness: 200 when the app can do its work, else 503 naming each check that failed."""
    startup = request.app[STARTUP_KEY]
    services = startup.services
    if services is None:
        return _readiness(request, startup, {
            "forge": {"ok": False, "detail": f"not reached yet: {startup.error}"}})
    checks: dict[str, dict[str, object]] = {}

    async def check(name: str, probe: Callable[[], Awaitable[str]]) -> None:
        try:
            checks[name] = {"ok": True, "detail": await asyncio.wait_for(probe(), 5.0)}
        except Exception as exc:  # each failure is reported, not raised
            checks[name] = {"ok": False, "detail": str(exc) or type(exc).__name__}

    async def database() -> str:
        if services.store.retired is not None:
            raise RuntimeError(services.store.retired)
        if services.store.write_failure is not None:  # until a write lands again
            raise RuntimeError(f"the latest write failed: {services.store.write_failure}")
        if services.store.engine == "sqlite":  # the file, on a connection of its own
            await asyncio.to_thread(health.take_write_lock, services.settings.db_path,
                                    WRITE_LOCK_WAIT)
        await services.store.check_writable()  # and the app's own connection takes one
        return "writable"

    async def forge() -> str:
        status = await services.forge_client.reachable()
        waiting, longest = budget_waits()
        if waiting and longest > BUDGET_WAIT_SHOWN:  # ready still: the budget is the forge's
            return (f"answered {status}; {waiting} write(s) wait for the forge's write budget, "
                    f"the longest {longest:.0f} s more")
        return f"answered {status}"

    async def installations() -> str:
        # known = read from the forge at start and kept by installation events; none yet is
        # still ready (the installation webhook must be able to reach the app)
        if not services.installations:
            return "none yet: install the App on an organisation"
        return ", ".join(f"{org}: {inst}" for org, inst in sorted(services.installations.items()))

    async def queue() -> str:
        stats = await services.store.queue_stats()
        if stats["oldest_due_age"] > STUCK_AFTER:
            raise RuntimeError(f"the oldest due delivery has waited "
                               f"{stats['oldest_due_age']:.0f} s (pending {stats['pending']})")
        return f"pending {stats['pending']}, dead {stats['dead']}"

    for name, probe in (("database", database), ("forge", forge),
                        ("installations", installations), ("queue", queue)):
        await check(name, probe)
    return _readiness(request, startup, checks)


async def metrics_endpoint(request: web.Request) -> web.Response:
    """Prometheus' text. They name each installation (its rate limit left): with an operator's
    token set, they are the operator's (Prometheus: `authorization: {credentials: ...}`)."""
    startup = request.app[STARTUP_KEY]
    services = startup.services
    settings = services.settings if services is not None else startup.settings
    if settings.operator_token and not _from_operator(request, settings):
        return json_response({"error": {
            "code": "operator_only", "message": "the metrics name each installation, so they "
            "are the operator's: send Authorization: Bearer <VAULTMAIL_OPERATOR_TOKEN>"}},
            status=401, headers={"WWW-Authenticate": "Bearer"})
    body, content_type = await metrics.render(services.store if services else None)
    return web.Response(body=body, headers={"Content-Type": content_type})


async def published_keys(request: web.Request) -> web.Response:
    """The public signing keys: one office's at /.well-known/vaultmail-keys/<org>.json (or
    ?org=<org>), which is what its receivers check against; every office's and the legacy
    ones at /.well-known/vaultmail-keys.json, as before offices had keys of their own: a
    list of every office here, so the operator's, as /metrics are."""
    services = request.app[SERVICES_KEY]
    org = request.match_info.get("org", request.query.get("org"))
    if org is None:
        if not _operator_sees(request, services.settings):
            return json_response({"error": {"code": "operator_only", "message": (
                "every office's keys name every office here, so they are the operator's: "
                "fetch your office's at /.well-known/vaultmail-keys/<org>.json, or send "
                "Authorization: Bearer <VAULTMAIL_OPERATOR_TOKEN>")}},
                status=401, headers={"WWW-Authenticate": "Bearer"})
        return json_response(services.keyring.public_jwks())
    try:
        office = office_name(org)
    except KeyringError as exc:
        return json_response({"error": {"code": "bad_office", "message": str(exc)}},
                             status=400)
    # keys are made for an installed office only, never for any name a request brings
    if services.installation_of(office) is None:
        await services.still_installed(office)  # (one row: installed through another replica?)
    if services.installation_of(office) is None and office not in services.keyring.offices():
        return json_response({"error": {"code": "no_office", "message": (
            f"no office {office} here: the App is not installed on {office}, and no key ever "
            "signed for it")}}, status=404)
    return json_response(services.keyring.public_jwks(office))


WORKER_KEY = web.AppKey("worker", Worker)
RECONCILER_KEY = web.AppKey("reconciler", Reconciler)
GITEA_ORGS_KEY = web.AppKey("gitea_orgs", GiteaOrgs)
FORWARDER_KEY = web.AppKey("forwarder", LedgerForwarder)
PRESENCE_KEY = web.AppKey("presence", Presence)
PRUNER_KEY = web.AppKey("pruner", Pruner)
DOCTOR_KEY = web.AppKey("doctor", DoctorSchedule)
CATCH_UP_KEY = web.AppKey("vault_catch_up", asyncio.Task[None])


def build_worker(services: Services) -> Worker:
    worker = Worker(services.store, services.router, services.own_router,
                    services.is_own_event, lambda item, log: context_for(services, item, log))
    services.wake_worker = worker.wake
    return worker


async def _adopt_rows_from_before_offices(services: Services) -> None:
    """Chats and runs written before rows carried their office can only be the one office's
    that a deployment with one office has (bot.store.offices); with several, they stay
    unowned, shown to no office."""
    org = services.default_org
    if org is not None:
        adopted = await offices.adopt_unowned(services.store, org)
        if adopted:
            log.info("rows from before offices adopted", extra={"org": org, "rows": adopted})


async def _provision_at_start(services: Services) -> None:
    """Gitea sends no installation event: queue a synthetic one, so the installation handler
    provisions the mail labels in every vault, as on GitHub."""
    from bot.forge import gitea_events as gitea

    guid, event, payload = gitea.startup_delivery()
    if await services.store.enqueue_delivery(guid, event, payload, gitea.encode(payload)):
        services.wake_worker()


class Startup:
    """Where start-up stands: the parts once the forge has answered, else the last error."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings  # (the probes' until `services` has them)
        self.services: Services | None = None
        # why it is not started yet (None once it is): until the first try at the forge has
        # an answer, that it is under way (a probe made then was told "(None)")
        self.error: str | None = f"{settings.api_url}: the first try is under way"
        self.next_try: float | None = None  # (monotonic) when the start tries the forge again
        self.ready = asyncio.Event()
        self.stopping_since: float | None = None  # (monotonic) when shutdown began
        # a start that cannot go on (not a forge it keeps trying: a REPLICA_ID another live
        # process uses, say): `serve` exits with `error`
        self.failed = asyncio.Event()

    def retry_in(self) -> float | None:
        """Seconds until a look again may find the app started: its next try at the forge
        (None, "shortly", once started: every look checks afresh)."""
        if self.services is not None or self.next_try is None:
            return None
        return self.next_try - time.monotonic()


# SIGTERM to the end of the worker's drain, at most; what is left of an orchestrator's grace
# period (10 s: Docker's and Kubernetes' default) goes to closing the rest and exiting
DRAIN_SECONDS = 8.0


STARTUP_KEY = web.AppKey("startup", Startup)
RETRY_MAX = 30.0  # seconds between tries to reach the forge at start, at most
ALWAYS_SERVED = ("/healthz", "/readyz", "/metrics")


@web.middleware
async def until_started(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Before the forge has answered, everything but the probes is 503 (GitHub records the
    failed deliveries; the reconciler asks for them again once the app runs)."""
    startup = request.app[STARTUP_KEY]
    if startup.services is None and request.path not in ALWAYS_SERVED:
        # why (the forge's address, an exception) is the operator's, as at /healthz
        why = (f" ({startup.error})" if _operator_sees(request, startup.settings)
               else " (the operator sees why at /readyz)")
        return json_response({"error": {"code": "starting", "message": (
            f"vaultmail is starting: the forge is not reachable yet{why}; it keeps trying, "
            "try again shortly")}}, status=503, headers=retry_headers(503, startup.retry_in()))
    return await handler(request)


def _report_failed_start(startup: Startup, task: asyncio.Task[None]) -> None:
    if task.cancelled() or task.exception() is None:
        return
    startup.error = f"start failed: {task.exception()}"
    log.error("start failed: %s", task.exception(), exc_info=task.exception())
    startup.failed.set()


def create_app(settings: Settings, *, wait_for_forge: bool = True) -> web.Application:
    """The aiohttp application; services start and stop with it (graceful drain on stop).

    With `wait_for_forge` (the embedded default, tests) start-up waits until the forge has
    answered; without it (`serve`) the app listens at once and connects in the background,
    trying again until the forge answers.
    """
    app = web.Application(middlewares=[until_started])
    startup = app[STARTUP_KEY] = Startup(settings)

    async def start(session: aiohttp.ClientSession) -> None:
        delay = 0.5
        while True:
            try:
                services = await build_services(settings, session)
                break
            except (aiohttp.ClientError, OSError, TimeoutError, ForgeError,
                    GitHubException) as exc:
                startup.error = f"{settings.api_url}: {exc!r}"
                if wait_for_forge:
                    raise
                log.warning("forge not reachable; trying again", extra={
                    "api": settings.api_url, "error": repr(exc), "retry_in": delay})
                startup.next_try = time.monotonic() + delay
                await asyncio.sleep(delay)
                delay = min(RETRY_MAX, delay * 2)
        app[SERVICES_KEY] = services
        await _adopt_rows_from_before_offices(services)
        # the forge write budget is kept in the index: replicas share it, and a restart
        # (a crash loop under load) does not spend the hour's budget again
        cfg = services.forge_client.config
        services.forge_client.shared_budget = SharedWriteBudget(services.store, Limits(
            per_minute=cfg.content_per_minute, per_hour=cfg.content_per_hour,
            endpoint_points_per_minute=cfg.endpoint_points_per_minute,
            min_interval=cfg.write_interval))
        presence = app[PRESENCE_KEY] = Presence(services.store, services.notifier)
        await presence.start(settings.replica_id or None, settings.public_url or None)
        # vaults renamed unheard, and an index behind the forge (restored from a backup),
        # caught up beside the serving, office by office: until its own is done, only an
        # office's keyed sends wait (a retry finds the mail its first try sent)
        app[CATCH_UP_KEY] = asyncio.create_task(catch_up_at_start(services),
                                                name="vaultmail-catch-up")
        worker = app[WORKER_KEY] = build_worker(services)
        app[RECONCILER_KEY] = Reconciler(
            services.store, services.forge_client.app, settings.reconcile_interval)
        worker.start()
        if settings.dialect == "gitea":
            await _provision_at_start(services)
            app[GITEA_ORGS_KEY] = GiteaOrgs(services)  # (no installation events)
            app[GITEA_ORGS_KEY].start()
        app[FORWARDER_KEY] = LedgerForwarder(services)
        app[FORWARDER_KEY].start()
        app[RECONCILER_KEY].start()
        app[PRUNER_KEY] = Pruner(services.store, settings.retention_days)
        app[PRUNER_KEY].start()
        app[DOCTOR_KEY] = DoctorSchedule(services, settings.doctor_interval)
        app[DOCTOR_KEY].start()  # the leader looks for writes the forge lost
        startup.services, startup.error = services, None
        startup.ready.set()
        log.info("app started", extra={"app": services.app_slug, "api": settings.api_url})
        # serving orgs from their own repositories: an entry for every office lets each org's
        # config reach that internal host (its ports probed, the errors read in its ledger)
        wide = settings.outbound.unscoped_inside() if settings.office_path is None else []
        if wide:
            log.warning(
                "VAULTMAIL_OUTBOUND_ALLOW lets every office's config reach %s: name the org "
                "each is for, and its port (acme=10.0.0.5:8080), unless every org here may "
                "send there",
                ", ".join(wide), extra={"entries": wide})

    async def stop() -> None:
        services = startup.services
        if services is None:
            return
        services.notifier.close()  # (again, for runners that skip on_shutdown)
        if CATCH_UP_KEY in app:  # (what it has not followed, the next start follows)
            app[CATCH_UP_KEY].cancel()
            await asyncio.gather(app[CATCH_UP_KEY], return_exceptions=True)
        await app[RECONCILER_KEY].stop()
        await app[FORWARDER_KEY].stop()
        if PRUNER_KEY in app:
            await app[PRUNER_KEY].stop()
        if DOCTOR_KEY in app:
            await app[DOCTOR_KEY].stop()
        if GITEA_ORGS_KEY in app:
            await app[GITEA_ORGS_KEY].stop()
        # in progress: finish, or back to the queue; the time requests in flight took (before
        # this, aiohttp waits for them) is taken from the same budget
        since = startup.stopping_since or time.monotonic()
        await app[WORKER_KEY].stop(max(0.5, DRAIN_SECONDS - (time.monotonic() - since)))
        await runs.stop(services)  # dispatches under way end; a command run is killed
        await app[PRESENCE_KEY].stop()  # what this replica held is free for the others
        await services.store.close()

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        if settings.office_path is not None:
            load_office(settings.office_path)  # an invalid file stops the start, with every error
        async with aiohttp.ClientSession() as session:
            if wait_for_forge:
                await start(session)
                yield
            else:
                task = asyncio.create_task(start(session), name="vaultmail-connect")
                task.add_done_callback(partial(_report_failed_start, startup))
                yield
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            await stop()

    async def answer_long_polls(app: web.Application) -> None:
        # runs once the listener is closed and before aiohttp waits for requests in flight
        startup.stopping_since = time.monotonic()
        if startup.services is not None:
            startup.services.notifier.close()

    app.on_shutdown.append(answer_long_polls)
    app.cleanup_ctx.append(lifecycle)
    app.router.add_post("/webhook", receive_webhook)
    app.router.add_post("/webhook/{org}", receive_webhook)  # an org's own (Gitea)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_endpoint)
    app.router.add_get("/.well-known/vaultmail-keys.json", published_keys)
    app.router.add_get("/.well-known/vaultmail-keys/{org}.json", published_keys)
    add_routes(app)
    add_mcp_routes(app)
    add_console_routes(app)  # the office console: pages, sign-in, live updates
    return app
