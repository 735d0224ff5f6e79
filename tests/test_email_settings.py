"""The host's email settings (never a repository config's): read from the environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.app.settings import EmailSettings, Settings, SettingsError
from bot.email.gateway import tls_context
from bot.email.relay import Relay, RelayError
from bot.email.server import ListenError
from tests.test_email_support import self_signed

GITEA = {"GITEA_URL": "http://forge.example", "GITEA_TOKEN": "t", "GITEA_WEBHOOK_SECRET": "s"}


def test_the_smtp_listener_and_relay_come_from_the_environment() -> None:
    plain = Settings.from_env(GITEA)
    assert plain.email.listen_port is None and plain.email.relay_url == ""
    settings = Settings.from_env({**GITEA, "HOST": "0.0.0.0", "VAULTMAIL_SMTP_PORT": "2525",
                                  "SMTP_URL": "smtps://bot%40acme:pw@relay.example",
                                  "VAULTMAIL_SMTP_MAX_BYTES": "2048",
                                  "VAULTMAIL_SMTP_SENDER_RATE": "7",
                                  "VAULTMAIL_SMTP_ATTACHMENT_MAX_BYTES": "1000"})
    email = settings.email
    assert (email.listen_host, email.listen_port, email.max_bytes, email.sender_rate,
            email.attachment_max_bytes) == ("0.0.0.0", 2525, 2048, 7, 1000)
    assert plain.email.attachment_max_bytes == 5 * 1_048_576
    relay = Relay.parse(email.relay_url)
    assert (relay.host, relay.port, relay.tls, relay.username, relay.password) == \
        ("relay.example", 465, "implicit", "bot@acme", "pw")
    assert Relay.parse("smtp+starttls://relay.example").port == 587
    assert Relay.parse("smtp://relay.example:2526").tls == "opportunistic"


def test_a_wrong_email_setting_is_one_line_naming_it() -> None:
    with pytest.raises(SettingsError, match=r"^SMTP_URL='http://x': should be smtp://"):
        Settings.from_env({**GITEA, "SMTP_URL": "http://x"})
    with pytest.raises(SettingsError, match=r"^VAULTMAIL_SMTP_PORT='70000': should be a port"):
        Settings.from_env({**GITEA, "VAULTMAIL_SMTP_PORT": "70000"})
    with pytest.raises(SettingsError,
                       match=r"^VAULTMAIL_SMTP_ATTACHMENT_MAX_BYTES='0': should be a number"):
        Settings.from_env({**GITEA, "VAULTMAIL_SMTP_ATTACHMENT_MAX_BYTES": "0"})
    with pytest.raises(RelayError):
        Relay.parse("smtp://")


def test_the_give_up_time_and_the_listeners_certificate_come_from_the_environment(
        tmp_path: Path) -> None:
    assert Settings.from_env(GITEA).email.give_up_after == 5 * 24 * 3600
    email = Settings.from_env({**GITEA, "VAULTMAIL_SMTP_GIVE_UP_SECONDS": "3600",
                               "VAULTMAIL_SMTP_TLS_CERT": str(tmp_path / "c.pem"),
                               "VAULTMAIL_SMTP_TLS_KEY": str(tmp_path / "k.pem")}).email
    assert (email.give_up_after, email.tls_cert, email.tls_key) == (
        3600, tmp_path / "c.pem", tmp_path / "k.pem")
    with pytest.raises(ListenError, match="cannot use .* for STARTTLS"):
        tls_context(email)  # no such files: the start stops, saying so
    with pytest.raises(ListenError, match="needs both"):
        tls_context(EmailSettings(tls_cert=tmp_path / "c.pem"))
    cert, key = self_signed(tmp_path)
    assert tls_context(EmailSettings(tls_cert=cert, tls_key=key)) is not None
    assert tls_context(EmailSettings()) is None


def test_the_domains_the_operator_vouches_for_name_an_org_or_its_account() -> None:
    """VAULTMAIL_SMTP_DOMAINS: `domain=org` (its login, bound to the account holding it at
    first use) or `domain=org#account`; a pair that is neither stops the start, where it
    was taken as vouching for no one (no `=`), or for a login as written (`=acme#x`)."""
    email = Settings.from_env({**GITEA, "VAULTMAIL_SMTP_DOMAINS":
                               "Mail.Acme.Example.=Acme, mail.globex.example=globex#5678"
                               " mail.initech.example=initech"}).email
    assert email.domains == {"mail.acme.example": "acme",
                             "mail.globex.example": "globex#5678",
                             "mail.initech.example": "initech"}
    assert email.vouched_by_login("ACME") == ["mail.acme.example"]
    assert email.vouched_by_login("globex") == []
    for wrong in ("mail.acme.example", "mail.acme.example=", "=acme",
                  "mail.acme.example=acme#", "mail.acme.example=acme#0",
                  "mail.acme.example=acme#x", "mail.acme.example=acme/x"):
        with pytest.raises(SettingsError, match=r"^VAULTMAIL_SMTP_DOMAINS=.*is not "
                                                r"domain=org: .*acme#1234"):
            Settings.from_env({**GITEA, "VAULTMAIL_SMTP_DOMAINS": f"a.example=a,{wrong}"})
