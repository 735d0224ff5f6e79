"""The `vaultmail` command."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import os
import socket
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from bot.app.logs import LEVELS, lean_records, setup_logging
from bot.cli.output import say
from bot.cli.process import StartupError, listen, stop_signal
from bot.store.where import is_postgres

# (what each command needs is loaded by that command: the shell's tool commands, which agents
# run one after another, start in a third of the time the whole app takes to load)


def _given_file(flag: str, path: str | None, what: str) -> None:
    """A file named on the command line is there, or StartupError naming the flag and it."""
    if path is not None and not Path(path).is_file():
        why = "is a directory" if Path(path).is_dir() else "no such file"
        raise StartupError(f"{flag} {path}: {why}: give {what}")


async def cmd_up(args: argparse.Namespace) -> int:
    _given_file("--office", args.office, "an office config (YAML; `vaultmail office check "
                "FILE` validates one), or leave --office out for the built-in example")
    if args.data:
        return await _up(args, Path(args.data))
    # without --data: a temp dir, keys and all, gone when `up` stops (or fails to start)
    with tempfile.TemporaryDirectory(prefix="vaultmail-", ignore_cleanup_errors=True) as tmp:
        return await _up(args, Path(tmp))


async def _up(args: argparse.Namespace, data: Path) -> int:
    from bot.app.embedded import PortInUse, start_embedded
    from bot.app.replicas import Replica, start_replicas
    from bot.app.settings import EmailSettings
    from bot.store.sqlite import IndexInUse, own_index

    if args.replicas < 1:
        say("vaultmail up: --replicas must be 1 or more", file=sys.stderr)
        return 2
    if args.replicas > 1 and not is_postgres(args.database_url or ""):
        say("vaultmail up: several replicas share one PostgreSQL database: add "
            "--database-url postgresql://USER@HOST/DB (or set DATABASE_URL)", file=sys.stderr)
        return 2
    if not is_postgres(args.database_url or ""):
        try:  # one process serves a SQLite index
            own_index(data / "index.sqlite3")
        except IndexInUse as exc:
            say(f"vaultmail up: {exc}", file=sys.stderr, flush=True)
            return 2
    try:
        embedded = await start_embedded(
            office_path=args.office, data_dir=data, persist_forge=bool(args.data),
            host=args.host, port=args.port, forge_port=args.forge_port, dialect=args.forge,
            database_url=args.database_url or "",
            replica_id="replica-1" if args.replicas > 1 else "",
            email=EmailSettings(listen_host=args.host, listen_port=args.smtp_port,
                                relay_url=os.environ.get("SMTP_URL", "")))
    except PortInUse as exc:
        say(f"vaultmail up: {exc}", file=sys.stderr, flush=True)
        return 2
    from bot.console.links import console_url, sign_in_lines

    others: list[Replica] = []
    if args.replicas > 1:
        others = await start_replicas(embedded.services.settings, args.replicas - 1)
        embedded.app_urls = [embedded.app_url, *(r.url for r in others)]
        embedded.spread_webhooks()  # the forge spreads its deliveries, as a load balancer
        embedded.write_tokens()
    stop = stop_signal()
    smtp = embedded.smtp_port
    say(f"vaultmail ready: app {embedded.app_url}  forge {embedded.forge.url}  "
        f"tokens {embedded.tokens_path}  console {console_url(embedded.app_url)}"
        + (f"  smtp {_shown_host(args.host)}:{smtp}" if smtp is not None else "")
        + (f"  replicas {' '.join(embedded.app_urls)}" if others else ""), flush=True)
    if smtp is not None:
        from bot.cli.email import example_line

        example = example_line(embedded.office, _shown_host(args.host), smtp)
        if example is not None:
            say(example, flush=True)
    oauth = embedded.services.settings.client_id != ""
    for line in sign_in_lines(embedded.app_url, embedded.office,
                              embedded.forge.user_password if oauth else None):
        say(line, flush=True)
    collect_as_served()  # (started: as `serve` tunes the collector, for the same reasons)
    try:
        await stop.wait()
    finally:
        await asyncio.gather(*(r.stop() for r in others))
        await embedded.stop()
    return 0


def _shown_host(host: str) -> str:
    """Where a client on this machine reaches a listener bound to `host`."""
    return {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)


async def cmd_serve(args: argparse.Namespace) -> int:
    from bot.app.settings import NotRegistered, Settings

    sock: socket.socket | None = None
    try:  # (read before the app is loaded: a mistyped setting is said at once)
        settings = Settings.from_env()
    except NotRegistered as unregistered:  # as Probot does: the registration page, then on
        from bot.app.setup import serve_until_registered

        sock = listen(unregistered.host, unregistered.port)
        if not await serve_until_registered(sock, unregistered, stop_signal().wait()):
            sock.close()
            return 0
        settings = Settings.from_env()  # the .env the registration wrote
    if args.log_level is None:
        setup_logging(settings.log_level)
    from aiohttp import web

    from bot.app.setup import add_registered_pages
    from bot.app.web import STARTUP_KEY, create_app
    from bot.email.gateway import GATEWAY_KEY, add_email
    from bot.email.server import ListenError
    from bot.store.sqlite import IndexInUse, own_index

    if not is_postgres(settings.database):
        try:  # one process serves a SQLite index (a second says so, before it listens)
            own_index(settings.db_path)
        except IndexInUse as exc:
            say(f"vaultmail serve: {exc}", file=sys.stderr, flush=True)
            return 2
    sock = sock or listen(settings.host, settings.port)
    # SIGTERM: long polls are answered at once, deliveries in progress finish or go back to
    # the queue, and what is left of the 10 s goes to requests still in flight
    app = create_app(settings, wait_for_forge=False)
    add_registered_pages(app, settings)
    email = settings.email
    if args.smtp_port is not None:  # the flag over VAULTMAIL_SMTP_PORT
        email = dataclasses.replace(email, listen_port=args.smtp_port)
    if email.listen_port is not None or email.relay_url:
        try:
            add_email(app, email)
        except ListenError as exc:
            sock.close()
            raise StartupError(str(exc)) from None
    runner = web.AppRunner(app, shutdown_timeout=5.0)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    stop = stop_signal()
    gateway = app.get(GATEWAY_KEY) if email.listen_port is not None else None
    smtp = f"  smtp {email.listen_host}:{gateway.port}" if gateway is not None else ""
    say(f"vaultmail serving on http://{settings.host}:{sock.getsockname()[1]}{smtp}",
        flush=True)
    failed = app[STARTUP_KEY].failed
    lean_records()
    tuned = asyncio.create_task(_tune_gc_once(app[STARTUP_KEY].ready))
    try:
        await asyncio.wait([asyncio.ensure_future(stop.wait()),
                            asyncio.ensure_future(failed.wait())],
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        tuned.cancel()
        await runner.cleanup()
    if failed.is_set():
        say(f"vaultmail: {app[STARTUP_KEY].error}", file=sys.stderr, flush=True)
        return 1
    return 0


async def cmd_forge(args: argparse.Namespace) -> int:
    import errno

    from bot.office.seed import seed_office_file
    from localforge.cli import run_forge

    _given_file("--seed", args.seed, "an office config (YAML) to seed the forge from")
    try:
        return await run_forge(args, seeder=seed_office_file)
    except OSError as exc:  # its port, bound as it starts (before it says it is ready)
        if exc.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES) or \
                "bind" not in str(exc):
            raise
        raise StartupError(f"cannot listen on {args.host}:{args.port}: "
                           f"{os.strerror(exc.errno)}: stop what uses that port or choose "
                           "another (--port)") from None


async def cmd_demo(args: argparse.Namespace) -> int:
    from bot.cli.demo import run_demo

    return await run_demo(args.data)


async def cmd_dead_letters(args: argparse.Namespace) -> int:
    from bot.cli.shell import done, existing_data_dir
    from bot.store import index_of, open_store

    store = await open_store(index_of(existing_data_dir(args.data)))
    try:
        if args.replay is not None:
            n = await store.replay(None if args.replay == "all" else int(args.replay))
            say(f"{n} dead letter(s) queued again; the app handles them when it runs")
            return 0
        dead = await store.dead_letters()
        if args.json:
            done({"dead_letters": [{"id": d.id, "delivery": d.guid, "event": d.event,
                                    "attempts": d.attempts, "error": d.last_error}
                                   for d in dead]})
        for d in dead if not args.json else []:
            action = d.payload.get("action", "")
            say(f"{d.id}\t{d.guid}\t{d.event}.{action}\t{d.attempts} attempts\t{d.last_error}")
        if not dead and not args.json:
            say("no dead letters")
        return 0
    finally:
        await store.close()


async def cmd_gitea_hook(args: argparse.Namespace) -> int:
    """An org's own webhook on Gitea: its URL and its current secret, made from the
    operator's, the org's id on the forge and its generation in the index; `--rotate`: a new
    one for that org."""
    from bot.app.hook_generations import grace_text
    from bot.app.intake import org_secrets, utc_text
    from bot.app.settings import WEBHOOK_GRACE
    from bot.cli.shell import existing_data_dir
    from bot.names import RULE, is_name
    from bot.store import hook_secrets, index_of, open_store

    secret = os.environ.get("GITEA_WEBHOOK_SECRET", "")
    if not secret:
        say("GITEA_WEBHOOK_SECRET is not set: set it to the secret `vaultmail serve` runs "
            "with, then ask again", file=sys.stderr)
        return 2
    base = (args.url or os.environ.get("VAULTMAIL_PUBLIC_URL") or "https://APP").rstrip("/")
    org = args.org.strip().lower()
    if not is_name(org):  # (the app answers 404 at any other /webhook/<org>)
        say(f"{org!r} is not a forge org's name ({RULE})", file=sys.stderr)
        return 2
    store = await open_store(index_of(existing_data_dir(args.data)))
    try:
        generation = await hook_secrets.generation(store, org)
        if generation.org_id is not None and args.rotate:
            generation = await hook_secrets.rotate(store, org, "operator")
    finally:
        await store.close()
    if generation.org_id is None:  # (its secret is made for the org's id, which is the forge's)
        say(f"the app has not seen an org {org}: add its bot user to the org as an owner; "
            "the app reads the bot's orgs at start and every 5 minutes; then ask again",
            file=sys.stderr)
        return 2
    [made] = org_secrets(secret, org, generation, generation.number)
    say(f"org webhook of {org} (type gitea, JSON, events Issues, Issue comment, Push):\n"
        f"  URL     {base}/webhook/{org}\n"
        f"  secret  {made}\n"
        f"it signs deliveries about {org} only; give it to {org}'s admins, never "
        "GITEA_WEBHOOK_SECRET itself")
    if args.rotate:  # (the app's grace, as this shell's environment says it)
        grace = float(os.environ.get("VAULTMAIL_WEBHOOK_GRACE_SECONDS") or WEBHOOK_GRACE)
        say(f"rotated (generation {generation.number}): set it on {org}'s webhook now; "
            f"the secret before it is accepted for {grace_text(grace)} "
            "(VAULTMAIL_WEBHOOK_GRACE_SECONDS), then refused; other orgs' are unchanged")
    elif generation.rotated_at is not None:
        say(f"generation {generation.number}, rotated {utc_text(generation.rotated_at)}")
    return 0


SERVE_EPILOG = "(every variable serve reads)"  # written out only when asked for


class _ServeHelp(argparse.RawDescriptionHelpFormatter):
    """`serve --help`'s epilog, written from the settings' own list (bot.cli.serve_help) only
    when asked for: every other command starts without loading the settings."""

    def add_text(self, text: str | None) -> None:
        if text == SERVE_EPILOG:
            from bot.cli.serve_help import serve_epilog

            text = serve_epilog()
        super().add_text(text)


class _Version(argparse.Action):
    """`--version`: the installed package's version, read only when asked (importlib.metadata
    and the look-up were 20-30 ms of every command's start)."""

    def __init__(self, option_strings: Sequence[str], dest: str) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                         nargs=0, help="show program's version number and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        import importlib.metadata

        say(f"vaultmail {importlib.metadata.version('vaultmail')}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vaultmail", description="Durable mail between people and agents on a forge.")
    parser.add_argument("--version", action=_Version)
    parser.add_argument("--log-level", type=str.lower, choices=LEVELS, default=None,
                        help="debug, info, warning, error or critical (default: LOG_LEVEL, "
                             "else info for serve, warning for the rest)")
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="local forge + app in one process (the embedded default)")
    up.add_argument("--office", help="office config (YAML); default: the built-in example")
    up.add_argument("--data", help="keep state here across restarts (default: a temp dir, "
                                   "removed when it stops)")
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--port", type=int, default=8080)
    up.add_argument("--forge-port", type=int, default=8081)
    up.add_argument("--forge", choices=["github", "gitea"], default="github",
                    help="the local forge's dialect (gitea: Gitea/Forgejo API, a bot user)")
    up.add_argument("--database-url", default=os.environ.get("DATABASE_URL"),
                    help="the index on PostgreSQL (postgresql://USER@HOST/DB; default: SQLite "
                         "in the data directory, or DATABASE_URL)")
    up.add_argument("--smtp-port", type=int, default=0,
                    help="the SMTP listener's port, on --host (default 0: any free one, "
                         "printed on the ready line)")
    up.add_argument("--replicas", type=int, default=1,
                    help="app processes sharing the PostgreSQL database, the forge spreading "
                         "its webhook deliveries across them (needs --database-url)")
    up.set_defaults(func=cmd_up)

    demo = sub.add_parser("demo", help="a scripted end-to-end story on the embedded forge")
    demo.add_argument("--data", help="keep the demo's state here (default: a temp dir, "
                                     "removed when it ends)")
    demo.set_defaults(func=cmd_demo)

    serve = sub.add_parser("serve", help="the app alone, against a real forge (env config)",
                           epilog=SERVE_EPILOG, formatter_class=_ServeHelp)
    serve.add_argument("--smtp-port", type=int, default=None,
                       help="receive email on this port (0: any free one; default: "
                            "VAULTMAIL_SMTP_PORT, else no SMTP listener)")
    serve.set_defaults(func=cmd_serve)

    from localforge.cli import add_forge_parser

    add_forge_parser(sub).set_defaults(func=cmd_forge)

    from bot.cli.office import add_office_commands

    add_office_commands(sub)

    from bot.cli.doctor import add_doctor_command

    add_doctor_command(sub)

    from bot.cli.email import add_email_commands

    add_email_commands(sub)

    from bot.cli.tools import add_tool_commands

    add_tool_commands(sub)

    from bot.cli.register import add_register_command

    add_register_command(sub)

    dead = sub.add_parser("dead-letters", help="list or replay deliveries that kept failing")
    dead.add_argument("--data", default="vaultmail-data")
    dead.add_argument("--replay", metavar="ID|all")
    dead.add_argument("--json", action="store_true")
    dead.set_defaults(func=cmd_dead_letters)

    hook = sub.add_parser("gitea-hook", help="an org's own webhook on Gitea: URL and secret")
    hook.add_argument("org")
    hook.add_argument("--url", help="the app's public URL (default: VAULTMAIL_PUBLIC_URL)")
    hook.add_argument("--rotate", action="store_true",
                      help="make ORG a new secret (its old one: refused after a grace, "
                           "VAULTMAIL_WEBHOOK_GRACE_SECONDS, default 1 hour)")
    hook.add_argument("--data", help="the data dir of the app or of `vaultmail up --data` "
                                     "(or VAULTMAIL_DATA; DATABASE_URL names the index)")
    hook.set_defaults(func=cmd_gitea_hook)
    return parser


def _default_level(command: str) -> str:
    level = os.environ.get("LOG_LEVEL", "").lower()
    level = {"trace": "debug", "warn": "warning", "fatal": "critical"}.get(level, level)
    if level in LEVELS:
        return level
    return "info" if command == "serve" else "warning"


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where it is installed (a dependency everywhere but Windows): the
    loop's own overhead was about a tenth of `serve`'s CPU per webhook with asyncio's."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


# the youngest generation collected after 10,000 more allocations than frees, not 700; the
# older two as Python has them (each after 20 of the one below, not 10)
GC_THRESHOLDS = (10_000, 20, 20)


async def _tune_gc_once(ready: asyncio.Event) -> None:
    """Once `serve` has started: what the start made (modules, settings, the offices, the
    caches' first entries) is kept out of every later collection (`gc.freeze`), and the
    collector runs less often. The collector was 5.5 % of `serve`'s CPU under
    bench.probot_compare, most of it full collections walking objects that live as long as
    the process; about 0.3 % after. Each web request's garbage is mostly freed by its
    reference counts; what cycles it leaves wait a little longer to be collected."""
    await ready.wait()
    collect_as_served()


def collect_as_served() -> None:
    """The start-up heap frozen out of later collections, the collector run less often
    (`_tune_gc_once`): `serve` once started, and a bench that runs the app in its own process
    (bench.inbox), so that it measures the app as `serve` runs it."""
    gc.collect()  # (what is garbage now is collected, not frozen)
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level or _default_level(args.command))
    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            code: int = runner.run(args.func(args))
        return code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        return _failed(args, exc)


def _failed(args: argparse.Namespace, exc: Exception) -> int:
    """What a command that failed prints and exits with: one line, what to do."""
    from bot.app.settings import NotRegistered, SettingsError
    from bot.office.config import OfficeConfigError

    if isinstance(exc, NotRegistered):  # a command that acts for an app, with none configured
        say(f"vaultmail {args.command}: no app to act for: pass --data DIR (the data "
            "directory of `vaultmail up --data DIR`), or run it where the App's settings are "
            f"(missing {', '.join(exc.missing)}; `vaultmail serve --help` lists them)",
            file=sys.stderr)
        return 2
    if isinstance(exc, SettingsError | OfficeConfigError | StartupError):
        say(f"vaultmail: {exc}", file=sys.stderr)
        return 2
    from bot.cli.shell import fail, infrastructure

    failure = infrastructure(exc)  # the app, the forge, the data directory
    if failure is None:
        raise exc  # a bug keeps its traceback
    return fail(args, failure)


if __name__ == "__main__":
    sys.exit(main())
