"""`vaultmail email dns`: the DNS records an organisation publishes for its agents' mailboxes,
the office's DKIM key made (in the data directory) if it has none yet."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from bot.cli.output import say
from bot.cli.shell import ShellFailure, existing_data_dir

if TYPE_CHECKING:  # (loaded by these commands alone: every other one starts without them)
    from bot.office.config import Office


def dns_records(domain: str, dkim_pem: bytes, mx_host: str, org: str = "",
                org_id: int | None = None) -> list[tuple[str, str, str]]:
    """(name, type, value) of each record: MX, SPF, DKIM, DMARC, and (with `org`) the one
    that proves the domain the office's (bot.email.domains), naming `org_id`, the org's id
    on the forge (words saying so where not given)."""
    from bot.email import keys
    from bot.email.domains import record_name, value_for

    dkim_name, dkim_value = keys.dns_record(dkim_pem, domain)
    return [
        (domain, "MX", f"10 {mx_host}."),
        (domain, "TXT", "v=spf1 mx -all"),
        (dkim_name, "TXT", dkim_value),
        (f"_dmarc.{domain}", "TXT", "v=DMARC1; p=quarantine; adkim=r; aspf=r"),
        *([(record_name(domain), "TXT", value_for(org, org_id))] if org else []),
    ]


def example_line(office: Office, host: str, port: int) -> str | None:
    """`vaultmail up`'s one line of Python that mails the office's first agent by email."""
    if office.email is None or not office.agents:
        return None
    agent = office.agents[0]
    to = f"{agent.slug}@{office.email.domain}"
    return (f"mail {agent.slug} by email: python3 -c \"import smtplib; smtplib.SMTP('{host}', "
            f"{port}).sendmail('you@example.org', ['{to}'], 'From: you@example.org\\r\\nTo: "
            f"{to}\\r\\nSubject: Hello\\r\\n\\r\\nHi there')\"")


async def cmd_email_dns(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from bot.email import keys
    from bot.mail.signing import KeyringError, office_name
    from bot.office.config import EmailConfig

    try:  # checked as the office config checks them
        domain = EmailConfig(domain=args.domain).domain
        office_name(args.org)
    except (ValidationError, KeyringError) as exc:
        why = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        raise ShellFailure("bad_argument", why.removeprefix("Value error, ")) from None
    data = existing_data_dir(args.data, needs="")
    pem = keys.office_key(data, args.org)
    for name, kind, value in dns_records(domain, pem, args.mx or f"mx.{domain}",
                                         args.org, args.org_id):
        say(f"{name}\t{kind}\t{value}")
    return 0


def add_email_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    email = sub.add_parser("email", help="real mailboxes: the DNS records to publish")
    esub = email.add_subparsers(dest="email_command", required=True)
    p = esub.add_parser("dns", help="print the MX, SPF, DKIM, DMARC and _vaultmail records of "
                                    "an office's mail domain (its DKIM key made if missing)")
    p.add_argument("--org", required=True, help="the office (organisation)")
    p.add_argument("--org-id", type=int, help="the organisation's id on the forge, which its "
                                              "_vaultmail record names (GitHub: gh api "
                                              "orgs/ORG --jq .id; Gitea: the id of GET "
                                              "/api/v1/orgs/ORG)")
    p.add_argument("--domain", required=True, help="its email.domain (mail.acme.example)")
    p.add_argument("--mx", help="the host whose SMTP listener receives the mail (default: "
                                "mx.DOMAIN)")
    p.add_argument("--data", help="the data dir (of `vaultmail up --data`, or VAULTMAIL_DATA)")
    p.set_defaults(func=cmd_email_dns)
