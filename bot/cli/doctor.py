"""`vaultmail doctor`: one anti-entropy pass by hand (bot.app.doctor), with progress and a
summary table; `--dry-run` says what it would repair and writes nothing."""

from __future__ import annotations

import argparse
import sys

from bot.cli.output import say
from bot.cli.shell import ShellFailure, done


async def cmd_doctor(args: argparse.Namespace) -> int:
    """Exit 0 when the forge and the index agree (or every difference was repaired), 1 when
    something is flagged (or, with --dry-run, would be repaired) or another pass is running,
    2 on a usage problem."""
    from bot.app.doctor import FLAGGED, MAX_REPAIRS, REPLY_WINDOW, WOULD_REPAIR, Doctor
    from bot.cli.office import app_services

    max_repairs = MAX_REPAIRS if args.max_repairs is None else args.max_repairs
    reply_window = REPLY_WINDOW if args.reply_days is None else args.reply_days * 86400.0

    async with app_services(args.data) as services:
        orgs = [args.org.lower()] if args.org else sorted(services.installations)
        if not orgs:
            raise ShellFailure("not_installed", "the App is not installed on any "
                               "organisation: install it, then run the doctor")
        for org in orgs:
            if services.installation_of(org) is None:
                raise ShellFailure("not_installed", f"the App is not installed on {org}")

        def progress(line: str) -> None:
            if not args.json:
                say(line, file=sys.stderr, flush=True)

        doctor = Doctor(services, dry_run=args.dry_run, max_repairs=max_repairs,
                        reply_window=reply_window, progress=progress)
        report = await doctor.run(orgs)
    if args.json:
        done({"dry_run": args.dry_run, **report.as_json()})
    else:
        say(("dry run: nothing written\n" if args.dry_run else "") + report.table())
    counts = report.counts()
    return 1 if report.busy or counts.get(FLAGGED) or counts.get(WOULD_REPAIR) else 0


# bot.app.doctor's defaults as `--help` shows them (that module loads the app's mail modules,
# which every other command starts without; tests/test_doctor.py holds the two to agreeing)
SHOWN_MAX_REPAIRS = 100
SHOWN_REPLY_DAYS = 2


def add_doctor_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("doctor", help="find writes the forge lost (state labels, replies) and "
                                      "repair them from the index")
    p.add_argument("--data", help="the data dir of `vaultmail up --data` (or VAULTMAIL_DATA)")
    p.add_argument("--org", help="only this organisation's office (default: every installation)")
    p.add_argument("--dry-run", action="store_true",
                   help="say what would be repaired; write nothing")
    p.add_argument("--max-repairs", type=int, default=None,
                   help=f"forge writes this pass makes at most in each office (default "
                        f"{SHOWN_MAX_REPAIRS})")
    p.add_argument("--reply-days", type=float, default=None,
                   help="look for the comments of replies ledgered this many days back "
                        f"(default {SHOWN_REPLY_DAYS:g})")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_doctor)
