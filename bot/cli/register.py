"""`vaultmail register`: register vaultmail's GitHub App from app.yml, on github.com or GitHub
Enterprise Server, through a page served on this machine; the App's credentials go to .env
(the flow is in bot/app/setup.py)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from bot.cli.output import say
from bot.cli.process import StartupError, listen, stop_signal

# (bot.app.setup is loaded by `register` alone: every other command starts without it)
GITHUB = "https://github.com"  # the forge's web address by default (bot.app.setup.GITHUB)


def _public_url(args: argparse.Namespace, env_file: Path) -> str:
    from bot.app.setup import SetupError, public_url_of

    url = args.url or os.environ.get("VAULTMAIL_PUBLIC_URL")
    if not url and env_file.exists():
        from dotenv import dotenv_values

        url = dotenv_values(env_file).get("VAULTMAIL_PUBLIC_URL")
    if not url:
        raise SetupError("--url is needed: the app's public URL, where the forge will send "
                         "webhooks (URL/webhook), e.g. --url https://vaultmail.example.com "
                         "(or set VAULTMAIL_PUBLIC_URL); to try it on this machine, "
                         "--url http://127.0.0.1:8080")
    return public_url_of(url)


async def cmd_register(args: argparse.Namespace) -> int:
    from bot.app.setup import (
        CREDENTIALS,
        Forge,
        Manifest,
        SetupError,
        SetupPage,
        load_manifest,
        registered_in,
        serve_page,
        shown_url,
    )

    env_file = Path(args.env_file)
    try:
        forge = Forge.from_web(args.forge)
        public_url = _public_url(args, env_file)
        manifest = load_manifest(Path(args.manifest) if args.manifest else None)
        if args.name is not None:
            Manifest.model_validate({**manifest.model_dump(), "name": args.name})
        already = registered_in(env_file)
        if already and not args.force:
            raise SetupError(f"{env_file} already holds {', '.join(already)} (an App registered "
                             "before): pass --force to replace its credentials with the new "
                             "App's, or --env-file another file")
        sock = listen(args.host, args.port, backlog=64)
    except (SetupError, StartupError) as exc:
        say(f"vaultmail register: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # --name
        say(f"vaultmail register: --name={args.name!r}: at most 34 characters ({exc})",
            file=sys.stderr)
        return 2
    page = SetupPage(forge=forge, manifest=manifest, env_file=env_file, org=args.org,
                     public_url=public_url, name=args.name, public=True if args.public else None)
    name = args.name or manifest.name
    where = f"for the organisation {args.org}" if args.org else "on your own account"
    shadowing = [n for n in CREDENTIALS if os.environ.get(n)]
    if shadowing:
        say(f"vaultmail register: note: {', '.join(shadowing)} set in this environment win "
            f"over {env_file} when `vaultmail serve` runs here", file=sys.stderr)
    try:
        if not await serve_page(sock, page, stop_signal().wait(), announce=(
                f"vaultmail register: open {page.link(shown_url(sock, args.host))} in a browser to "
                f"register {name} on {forge.web} {where} (webhooks to {public_url}/webhook)")):
            say("vaultmail register: stopped before the App was registered: nothing written",
                file=sys.stderr)
            return 1
    finally:
        sock.close()
    done = page.registered
    assert done is not None
    removed = f"; taken out, superseded: {', '.join(done.env.removed)}" if done.env.removed \
        else ""
    say(f"registered {done.slug} (App {done.app_id}, owned by {done.owner}) on {forge.web}: "
        f"{', '.join(done.env.written)} written to {env_file} (mode 0600; {done.env.kept} "
        f"other line(s) kept{removed})", flush=True)
    # in this order: installing sends the browser to the app's setup URL, and webhooks to it,
    # so the app must be running first
    say(f"next: run `vaultmail serve` where it reads that .env, so that it answers at "
        f"{public_url} (the forge sends webhooks there, and your browser to "
        f"{public_url}/setup/installed once you install)", flush=True)
    say(f"then install it: {done.install_url}", flush=True)
    return 0


def add_register_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("register", help="register the GitHub App from app.yml (writes .env)")
    p.add_argument("--org", help="register it for this organisation (you must own it); "
                                 "default: your own account")
    p.add_argument("--forge", default=GITHUB,
                   help=f"the forge's web address (default {GITHUB}; GitHub Enterprise "
                        "Server: https://HOST)")
    p.add_argument("--url", help="the app's public URL: webhooks go to URL/webhook (default: "
                                 "VAULTMAIL_PUBLIC_URL)")
    p.add_argument("--port", type=int, default=3000, help="this page's port (default 3000)")
    p.add_argument("--host", default="127.0.0.1", help="this page's address (default 127.0.0.1)")
    p.add_argument("--env-file", default=".env", help="where the credentials go (default .env)")
    p.add_argument("--manifest", help="the manifest (default ./app.yml, else vaultmail's own)")
    p.add_argument("--name", help="the App's name, unique on the forge (default: app.yml's)")
    p.add_argument("--public", action="store_true",
                   help="let any account install it (a private App installs only on its owner)")
    p.add_argument("--force", action="store_true",
                   help="replace the credentials of an App already in the .env")
    p.set_defaults(func=cmd_register)
