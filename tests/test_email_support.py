"""What the email tests share (no tests of its own): DNS answered from a table, an SMTP relay
on loopback that keeps what it is sent, the app with its SMTP listener, and smtplib as an
ordinary client (on a worker thread: the app listens on the test's own event loop)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import smtplib
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import aiohttp
import dkim
import pytest
from aiosmtpd.smtp import SMTP, Envelope, Session
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from bot.app.embedded import Embedded, start_embedded
from bot.app.settings import EmailSettings
from bot.email import keys
from bot.email.auth import DnsError
from bot.email.domains import record_name, record_value
from bot.store import mails
from localforge.faults import Hold
from tests.support import Actor, ToolClient

DOMAIN = "mail.acme.example"
# acme's id on the local forge as the embedded seeds it (the admin's account is made first):
# what acme's `_vaultmail` record names (bot.email.domains), published before the app starts
ACME_ID = 1002
ATTACHMENT_MAX_BYTES = 200_000  # the mailroom's limit on one attachment (its message: 1 MiB)


@dataclass
class TableDns:
    """DNS from dicts; a name listed in `failing` times out (a temporary error)."""

    txts: dict[str, list[str]] = field(default_factory=dict)
    hosts: dict[str, list[str]] = field(default_factory=dict)
    mxs: dict[str, list[str]] = field(default_factory=dict)
    failing: set[str] = field(default_factory=set)
    asked: list[str] = field(default_factory=list)  # each name looked up, in order

    def _look(self, table: dict[str, list[str]], name: str) -> list[str]:
        self.asked.append(name.lower())
        if name.lower() in self.failing:
            raise DnsError(f"{name}: timed out")
        return list(table.get(name.lower().rstrip("."), []))

    def txt(self, name: str) -> list[str]:
        return self._look(self.txts, name)

    def addresses(self, name: str) -> list[str]:
        return self._look(self.hosts, name)

    def mx(self, name: str) -> list[str]:
        return self._look(self.mxs, name)


def rsa_pem() -> bytes:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 signed by its own key (EC P-256: quick to make), and the
    key, as PEM files in `folder`: the listener's STARTTLS in the tests."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / "smtp-cert.pem", folder / "smtp-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


# the headers a DKIM signer signs (RFC 6376 5.4.1's list, as large providers sign)
SIGNED = ("from", "to", "cc", "subject", "date", "message-id", "in-reply-to", "references")


@dataclass
class Sender:
    """An outside domain with SPF, DKIM and DMARC published in `dns`."""

    domain: str
    dns: TableDns
    pem: bytes = field(default_factory=rsa_pem)

    def publish(self, *, spf: str = "v=spf1 ip4:127.0.0.0/8 -all",
                dmarc: str = "v=DMARC1; p=reject") -> None:
        name, value = keys.dns_record(self.pem, self.domain, selector="s1")
        self.dns.txts[name] = [value]
        self.dns.txts[self.domain] = [spf]
        self.dns.txts[f"_dmarc.{self.domain}"] = [dmarc]

    def sign(self, raw: bytes, *, headers: tuple[str, ...] = SIGNED,
             length: bool = False) -> bytes:
        """`raw` signed over `headers` (h=: a header named and absent may not be added
        after); `length`: with an l= of the body's length."""
        return bytes(dkim.sign(raw, b"s1", self.domain.encode(), self.pem,
                               include_headers=[h.encode() for h in headers],
                               length=length)) + raw


def message(frm: str, to: str, subject: str, text: str, **headers: str) -> EmailMessage:
    msg = EmailMessage()
    msg["From"], msg["To"], msg["Subject"] = frm, to, subject
    for name, value in headers.items():
        msg[name.replace("_", "-")] = value
    msg.set_content(text)
    return msg


def with_files(msg: EmailMessage, *files: tuple[str, str, bytes]) -> EmailMessage:
    """`msg` with each (file name, MIME type, bytes) attached, as a mail client attaches."""
    for filename, kind, data in files:
        maintype, _, subtype = kind.partition("/")
        msg.add_attachment(data, maintype=maintype, subtype=subtype, filename=filename)
    return msg


def wire(msg: EmailMessage) -> bytes:
    from email import policy

    return msg.as_bytes(policy=policy.SMTP)


@dataclass
class Answer:
    """What the SMTP server said to a client: the code and text of the last reply."""

    code: int
    text: str
    refused: dict[str, tuple[int, bytes]] = field(default_factory=dict)


class _Client(smtplib.SMTP):
    """smtplib's client, keeping the server's answer to DATA (it names the delivered mail)."""

    last_data_answer = ""

    def data(self, msg: Any) -> tuple[int, bytes]:
        code, text = super().data(msg)
        self.last_data_answer = text.decode()
        return code, text


def _smtp_send(port: int, mail_from: str, rcpts: list[str], data: bytes,
               tls: ssl.SSLContext | None = None, source: str | None = None) -> Answer:
    with _Client("127.0.0.1", port, timeout=60,
                 source_address=None if source is None else (source, 0)) as client:
        client.ehlo("client.example.org")
        if tls is not None:
            client.starttls(context=tls)
            client.ehlo("client.example.org")
        try:
            refused = client.sendmail(mail_from, rcpts, data)
        except smtplib.SMTPRecipientsRefused as exc:
            code, text = next(iter(exc.recipients.values()))
            return Answer(code, text.decode(), dict(exc.recipients))
        except smtplib.SMTPResponseException as exc:
            said = exc.smtp_error
            return Answer(exc.smtp_code, said.decode() if isinstance(said, bytes) else said)
        return Answer(250, client.last_data_answer, refused)


async def send(port: int, data: bytes, *, rcpts: list[str],
               mail_from: str = "bob@example.org", tls: ssl.SSLContext | None = None,
               source: str | None = None) -> Answer:
    """Send over real SMTP as an ordinary client would (after STARTTLS with `tls`), from
    loopback address `source` (default 127.0.0.1)."""
    return await asyncio.to_thread(_smtp_send, port, mail_from, rcpts, data, tls, source)


async def install_office(room: Mailroom, config: str, *, proven: bool = False) -> str:
    """Another org, seeded from its office `config` (YAML) and its config pushed, installs
    the App beside acme; its org. `proven`: its email domain's `_vaultmail` record names
    its id, published before it installs."""
    from bot.office.config import parse_office
    from bot.office.seed import seed_office

    emb = room.embedded
    office = parse_office(config, "another.yml", repository=False)
    seed_office(emb.forge, office)
    account = emb.forge.state.account(office.org)
    if proven and office.email is not None and account is not None:
        room.dns.txts[record_name(office.email.domain)] = [record_value(account.id)]
    emb.forge.put_file(f"{office.org}/.github", "vaultmail.yml", config, pusher="admin")
    (app_id,) = emb.forge.state.apps
    emb.forge.install_app(int(app_id), office.org)
    await emb.settle()
    assert office.org in emb.services.installations
    return office.org


async def delivered(room: Mailroom, answer: Answer) -> list[str]:
    """The mails (owner/repo#n) a `250 ... delivered as <mail id>, ...` answer names: the
    answer itself names no repository (a stranger learns none), the index maps its ids."""
    found = re.search(r"delivered as ([^;]+)", answer.text)
    assert answer.code == 250 and found is not None, answer
    refs = []
    for mail_id in found.group(1).split(","):
        mail = await mails.get_mail(room.embedded.services.store, mail_id.strip())
        assert mail is not None, (mail_id, answer)
        refs.append(mail.ref)
    assert not any(ref in answer.text for ref in refs), answer
    return refs


class CapturingRelay:
    """An SMTP relay on loopback that keeps each message it accepts (or answers `refuse`)."""

    def __init__(self) -> None:
        self.received: asyncio.Queue[Envelope] = asyncio.Queue()
        self.refuse: list[str] = []  # answers to give to the next DATA commands, in order
        # answers to give to the next RCPT commands naming an address, in order (a mailbox
        # full at the far end: 450), and when each RCPT for it came
        self.refuse_rcpt: dict[str, list[str]] = {}
        self.rcpt_at: dict[str, list[float]] = {}
        self.greetings: list[Hold] = []  # EHLOs to leave unanswered until released
        self.quit_answers: list[str] = []  # answers to give to the next QUITs, in order
        self.port = 0
        self._server: asyncio.base_events.Server | None = None

    def hold_greeting(self) -> Hold:
        """Leave the next client's EHLO unanswered until the returned hold is released (a
        relay slow to greet): the client has connected, and sent nothing of its message."""
        held = Hold(route="EHLO")
        self.greetings.append(held)
        return held

    async def handle_EHLO(self, server: SMTP, session: Session, envelope: Envelope,
                          hostname: str, responses: list[str]) -> list[str]:
        session.host_name = hostname  # (a hook of its own sets it, as aiosmtpd's does)
        if self.greetings:
            held = self.greetings.pop(0)
            held._caught_one()  # noqa: SLF001 (localforge's hold, kept by this relay)
            await held.released.wait()
        return responses

    async def handle_RCPT(self, server: SMTP, session: Session, envelope: Envelope,
                          address: str, rcpt_options: list[str]) -> str:
        self.rcpt_at.setdefault(address, []).append(time.time())
        answers = self.refuse_rcpt.get(address)
        if answers:
            return answers.pop(0)
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        if self.refuse:
            return self.refuse.pop(0)
        self.received.put_nowait(envelope)
        return "250 2.0.0 queued"

    async def handle_QUIT(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        return self.quit_answers.pop(0) if self.quit_answers else "221 Bye"

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: SMTP(self, loop=loop),
                                                host="127.0.0.1", port=0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def next(self) -> Envelope:
        return await asyncio.wait_for(self.received.get(), 60)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


@dataclass
class Mailroom:
    embedded: Embedded
    dns: TableDns
    relay: CapturingRelay
    session: aiohttp.ClientSession
    cert: Path  # the listener's STARTTLS certificate (self-signed)
    database_url: str = ""  # "": SQLite in the data directory

    @property
    def index(self) -> str:
        """Where the index is, for another replica's own `open_store`."""
        return self.database_url or str(self.embedded.data_dir / "index.sqlite3")

    def person(self, login: str) -> Actor:
        return Actor(self.session, self.embedded, login)

    def tools(self, principal: str) -> ToolClient:
        return ToolClient(self.session, self.embedded, principal)

    async def outbox_settled(self) -> int:
        """Wait for the outbox's round in progress (a drain takes the office's outbox lock),
        then send what is left; returns how many went in this call."""
        from bot.email.gateway import GATEWAY_KEY

        outbox = self.embedded.runner.app[GATEWAY_KEY].outbox
        assert outbox is not None
        return sum([await outbox.drain(office) for office in await outbox.offices()])

    @property
    def port(self) -> int:
        port = self.embedded.smtp_port
        assert port is not None
        return port


@contextlib.asynccontextmanager
async def open_mailroom(tmp_path: Path, database_url: str, dialect: str = "github",
                        record: str = record_value(ACME_ID),
                        domains: dict[str, str] | None = None) -> AsyncIterator[Mailroom]:
    """The embedded default (its local forge speaking `dialect`) with its SMTP listener on a
    free loopback port, DNS from a table, and replies going out to a capturing relay.
    `record`: the value of acme's `_vaultmail` record (bot.email.domains), as acme publishes
    it: its id. `domains`: those the operator vouches for (VAULTMAIL_SMTP_DOMAINS)."""
    dns = TableDns(txts={record_name(DOMAIN): [record]})
    relay = CapturingRelay()
    await relay.start()
    cert, key = self_signed(tmp_path)
    emb = await start_embedded(
        data_dir=tmp_path, port=0, forge_port=0, dialect=dialect, database_url=database_url,
        email=EmailSettings(listen_port=0, relay_url=f"smtp://127.0.0.1:{relay.port}",
                            max_bytes=1_048_576, sender_rate=5,
                            attachment_max_bytes=ATTACHMENT_MAX_BYTES, tls_cert=cert,
                            tls_key=key, domains=domains or {}),
        resolver=dns)
    try:
        acme = emb.forge.state.account("acme")
        assert acme is not None and acme.id == ACME_ID, "the local forge seeds ids otherwise"
        async with aiohttp.ClientSession() as session:
            yield Mailroom(emb, dns, relay, session, cert, database_url)
    finally:
        await emb.stop()
        await relay.stop()


@pytest.fixture
async def mailroom(tmp_path: Path, database_url: str) -> AsyncIterator[Mailroom]:
    """The mailroom on the local forge speaking GitHub's dialect."""
    async with open_mailroom(tmp_path, database_url) as room:
        yield room
