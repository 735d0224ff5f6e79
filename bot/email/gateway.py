"""Email in the app's life: the SMTP listener and the outbox start with the app and stop
before it (an aiohttp cleanup context added to the app `create_app` built), whichever command
runs it (`vaultmail up`, `vaultmail serve --smtp-port`, the tests)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass

from aiohttp import web

from bot.app.settings import EmailSettings
from bot.app.web import STARTUP_KEY
from bot.email.auth import Resolver
from bot.email.domains import DomainProofs
from bot.email.intake import EmailIntake
from bot.email.outbox import Outbox
from bot.email.policy import SharedSenderRate
from bot.email.server import ListenError, SmtpHandler, SmtpServer, bind


@dataclass
class EmailGateway:
    """The running parts; `port` is the listener's (None without one)."""

    server: SmtpServer | None
    intake: EmailIntake | None = None
    outbox: Outbox | None = None

    @property
    def port(self) -> int | None:
        return self.server.port if self.server is not None else None


GATEWAY_KEY = web.AppKey("email", EmailGateway)


def _system_resolver() -> Resolver:
    from bot.email.dns import SystemResolver

    return SystemResolver()


def tls_context(settings: EmailSettings) -> ssl.SSLContext | None:
    """The listener's STARTTLS context from the certificate and key settings (None without
    them); ListenError when only one is set or they cannot be loaded."""
    if settings.tls_cert is None and settings.tls_key is None:
        return None
    if settings.tls_cert is None or settings.tls_key is None:
        raise ListenError("STARTTLS needs both VAULTMAIL_SMTP_TLS_CERT and "
                          "VAULTMAIL_SMTP_TLS_KEY (a PEM certificate and its key)")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(settings.tls_cert, settings.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise ListenError(f"cannot use {settings.tls_cert} and {settings.tls_key} for "
                          f"STARTTLS: {exc}") from None
    return context


def add_email(app: web.Application, settings: EmailSettings, *,
              resolver: Resolver | None = None, sock: socket.socket | None = None) -> None:
    """Run email with `app`: the listener when `settings.listen_port` is set (0: any free
    port; on `sock` when it is bound already), the outbox (replies out through
    `settings.relay_url`) once the app has started. ListenError when the port is taken, here,
    before anything is started."""
    tls = tls_context(settings) if sock is not None or settings.listen_port is not None \
        else None
    if sock is None and settings.listen_port is not None:
        sock = bind(settings.listen_host, settings.listen_port)
    startup = app[STARTUP_KEY]

    def intake() -> EmailIntake | None:
        return gateway.intake

    resolver = resolver or _system_resolver()
    handler = SmtpHandler(intake, resolver,
                          rate=SharedSenderRate(settings.sender_rate),
                          attachment_max_bytes=settings.attachment_max_bytes)
    server = None if sock is None else SmtpServer(
        handler, sock, max_bytes=settings.max_bytes, hostname=settings.hostname,
        tls_context=tls)
    gateway = app[GATEWAY_KEY] = EmailGateway(server)

    async def when_started() -> None:
        await startup.ready.wait()
        services = startup.services
        assert services is not None
        gateway.intake = EmailIntake(services, DomainProofs(resolver, services.store,
                                                                settings.domains))
        gateway.outbox = Outbox(services, gateway.intake, settings.relay_url,
                                give_up_after=settings.give_up_after)
        gateway.outbox.start()

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        if server is not None:
            await server.start()
        starting = asyncio.create_task(when_started(), name="vaultmail-email-start")
        yield
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting
        if server is not None:
            await server.stop()
        if gateway.outbox is not None:
            await gateway.outbox.stop()

    app.cleanup_ctx.append(lifecycle)
