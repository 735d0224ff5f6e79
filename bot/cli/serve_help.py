"""`vaultmail serve --help`: every variable `serve` reads, by each name it takes, from the one
list of them (`bot.app.settings._EnvFile`), so the help cannot fall behind the settings."""

from __future__ import annotations

import textwrap

from pydantic import AliasChoices

from bot.app.settings import _EnvFile

INTRO = """\
vaultmail serve needs a forge to talk to: a GitHub App (`vaultmail register` registers one and
writes its credentials to .env; started without any, serve offers the registration page on its
port), or a Gitea/Forgejo bot user. To try vaultmail without a forge, run `vaultmail up`."""
WIDTH = 96

# (heading, [(field of _EnvFile, what it holds)]); a field added to the settings without a line
# here is still listed, under "Also read"
GROUPS: list[tuple[str, list[tuple[str, str]]]] = [
    ("A GitHub App (`vaultmail register` writes these to .env)", [
        ("app_id", "the App's numeric id"),
        ("private_key_path", "the App's private key, a PEM file"),
        ("private_key", "or the key itself (one line with \\n escapes is fine)"),
        ("webhook_secret", "the webhook secret set on the App (mandatory)"),
        ("client_id", "the App's OAuth client id: the console's sign-in"),
        ("client_secret", "the App's OAuth client secret"),
        ("ghe_host", "GitHub Enterprise Server's host (API https://HOST/api/v3)"),
        ("ghe_protocol", "http for a GitHub Enterprise Server on plain HTTP (default https)"),
        ("api_url", "any API URL instead (default https://api.github.com)"),
        ("org", "registration from `serve`: the organisation to register the App for"),
    ]),
    ("Or a Gitea/Forgejo bot user", [
        ("gitea_url", "the forge's URL (e.g. https://gitea.example.com)"),
        ("gitea_token", "the bot user's access token"),
        ("gitea_webhook_secret", "the secret of the org webhook pointed at /webhook"),
    ]),
    ("Where it runs", [
        ("host", "the address to listen on (default 0.0.0.0)"),
        ("port", "the port to listen on (default 8080)"),
        ("public_url", "where people and the forge reach the app (OAuth callback, Secure "
                       "cookies, the setup page's webhook URL)"),
        ("data", "where the index (SQLite) and the signing keys live (default "
                 "./vaultmail-data)"),
        ("database_url", "the index: sqlite:///PATH or postgresql://USER@HOST/DB (replicas)"),
        ("replica_id", "this replica's name; restarted under it, it takes back its work"),
        ("sqlite_synchronous", "normal (survives a crash) or full (a power cut too)"),
        ("log_level", "debug, info, warning, error or critical (default info)"),
    ]),
    ("What the operator decides", [
        ("office", "a local office file instead of the org's .github/vaultmail.yml"),
        ("agent_commands", "a YAML file: the program each org's `dispatch: command` agent "
                           "runs here, by org (acme:, bound to the org account first using "
                           "it, as VAULTMAIL_OUTBOUND_ALLOW's; acme#1234: account 1234's), "
                           "then slug"),
        ("outbound_allow", "hosts and networks dispatch URLs and office webhooks may reach "
                           "besides public addresses, comma-separated, each for one org "
                           "(acme=10.0.0.5, bound to the org account first using it; "
                           "acme#1234=10.0.0.5: account 1234's) or every org, on one port "
                           "(acme=10.0.0.5:8080, [fd00::1]:8080) or every port"),
        ("allowed_origins", "origins a browser page may call /mcp from, comma-separated"),
        ("trusted_proxies", "proxies (an ingress) whose X-Forwarded-For names the client "
                            "(and -Proto, -Host the address reached, without a public URL), "
                            "comma-separated addresses or networks"),
        ("operator_token", "Bearer token that shows /readyz's detail"),
        ("reconcile_seconds", "how often failed webhook deliveries are looked for (default "
                              "300)"),
        ("doctor_seconds", "how often the leader repairs writes the forge lost (default 900)"),
        ("webhook_read_seconds", "a webhook body not sent whole within this is answered 408 "
                                 "(default 20)"),
        ("webhook_grace_seconds", "Gitea: how long an org's webhook secret from before "
                                  "`gitea-hook ORG --rotate` is still accepted (default "
                                  "3600)"),
        ("retention_days", "how long handled deliveries and idempotency results are kept "
                           "(default 7, at least 3)"),
    ]),
    ("Email (also --smtp-port)", [
        ("smtp_port", "receive email on this port (0: any free one; unset: no listener)"),
        ("smtp_host", "where the SMTP listener listens (default: HOST)"),
        ("smtp_url", "the relay replies go out through: smtp://, smtp+starttls:// or smtps://"),
        ("smtp_max_bytes", "the largest message taken (default 10 MiB)"),
        ("smtp_sender_rate", "messages a minute one outside sender may send one agent "
                             "(default 20; five times it from one authenticated domain's "
                             "senders together)"),
        ("smtp_hostname", "the name the listener greets with (default vaultmail)"),
        ("smtp_domains", "email domains vouched for without DNS, domain=org pairs "
                         "(mail.acme.example=acme, bound to the org account first using it, "
                         "as VAULTMAIL_OUTBOUND_ALLOW's; =acme#1234: account 1234's)"),
    ]),
]


def _names(field: str) -> str:
    alias = _EnvFile.model_fields[field].validation_alias
    names = [str(c) for c in alias.choices] if isinstance(alias, AliasChoices) else [field]
    return " or ".join(names)


def _line(field: str, what: str) -> list[str]:
    names = _names(field)
    indent = " " * 27
    text = textwrap.wrap(what, WIDTH - len(indent))
    head = [f"  {names:<24} {text[0]}"] if len(names) <= 24 else [f"  {names}",
                                                                  indent + text[0]]
    return head + [indent + rest for rest in text[1:]]


def serve_epilog() -> str:
    """The quick start, then every variable by group (the environment first, then .env)."""
    lines = [INTRO, "", "Every variable serve reads (the environment first, then .env):"]
    described: set[str] = set()
    for heading, fields in GROUPS:
        lines += ["", f"{heading}:"]
        for field, what in fields:
            if field in _EnvFile.model_fields:
                lines += _line(field, what)
                described.add(field)
    rest = [f for f in _EnvFile.model_fields if f not in described]
    if rest:
        lines += ["", "Also read:"] + [f"  {_names(f)}" for f in rest]
    return "\n".join(lines)
