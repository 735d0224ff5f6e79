"""Outbound requests go only where they may (issue 21): an org's config names the URLs its runs
are dispatched to and its webhooks, and one deployment serves many orgs, so neither may reach
what only the app's host can (loopback, the cloud's metadata service, private networks) unless
the operator allows it (VAULTMAIL_OUTBOUND_ALLOW). Refused at config load where the URL says so
itself, else at send time once its name is resolved; a real loopback receiver shows that
nothing arrives without the allow-list, and that it does with it."""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import AsyncIterator
from ipaddress import ip_address
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult

from bot.app.egress import OutboundPolicy, OutboundRefused, address_kind
from bot.app.embedded import Embedded, start_embedded
from bot.app.runs import DISPATCH_ATTEMPTS
from bot.app.signed_post import post_signed
from bot.mail.signing import Keyring
from bot.names import Behalf
from bot.office.config import OfficeConfigError
from bot.store import installations, ledger, mails
from bot.store import outbound as cursors
from tests.support import ToolClient, served, until

MARCO = "human:marco@acme.com"
ACME, GLOBEX_OFFICE = Behalf("acme"), Behalf("globex")  # (their accounts not known)
CONFIG = "acme/.github/vaultmail.yml"


class Receiver:
    """A loopback HTTP endpoint that keeps what reaches it, by path."""

    def __init__(self) -> None:
        self.got: list[tuple[str, dict[str, str]]] = []
        self.port = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self.got.append((request.path, dict(request.headers)))
        if request.path == "/moved":  # where a redirect would take the request inside
            raise web.HTTPTemporaryRedirect("/inside")
        if request.path == "/down":
            return web.Response(status=503)
        return web.Response(status=204)

    def paths(self) -> list[str]:
        return [path for path, _ in self.got]


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    rec = Receiver()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", rec.handle)
    async with served(app) as url:
        rec.port = int(url.rsplit(":", 1)[1])
        yield rec


class Names(AbstractResolver):
    """DNS for the test: every name under acme.example is `address`, 127.0.0.1 unless told (as
    a hostile or careless org's DNS could say); counts the lookups."""

    def __init__(self, address: str = "127.0.0.1") -> None:
        self.asked: list[str] = []
        self.address = address

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        self.asked.append(host)
        if not host.endswith(".acme.example"):
            raise OSError(f"{host}: unknown to the test's DNS")
        return [ResolveResult(hostname=host, host=self.address, port=port,
                              family=socket.AF_INET, proto=0, flags=socket.AI_NUMERICHOST)]

    async def close(self) -> None:
        pass


# -- which addresses ---------------------------------------------------------------------------

@pytest.mark.parametrize(("address", "kind"), [
    ("127.0.0.1", "loopback"), ("127.8.9.10", "loopback"), ("::1", "loopback"),
    ("169.254.169.254", "link-local"), ("fe80::1", "link-local"),
    ("10.0.0.1", "private"), ("172.16.5.4", "private"), ("192.168.1.1", "private"),
    ("fc00::1", "private"), ("fd12:3456::1", "private"),
    ("100.64.0.1", "carrier-grade NAT"), ("100.127.255.254", "carrier-grade NAT"),
    ("224.0.0.1", "multicast"), ("239.1.2.3", "multicast"), ("ff02::1", "multicast"),
    ("0.0.0.0", "unspecified"), ("::", "unspecified"),
    ("240.0.0.1", "reserved"), ("255.255.255.255", "reserved"), ("fec0::1", "site-local"),
    ("::ffff:127.0.0.1", "loopback"), ("::ffff:169.254.169.254", "link-local"),
    ("::ffff:10.0.0.1", "private"), ("64:ff9b::a00:1", "private"),
    ("2002:a9fe:a9fe::", "link-local"),
    ("192.0.2.1", "documentation"), ("198.18.0.1", "benchmarking"),
])
def test_addresses_the_app_does_not_send_to(address: str, kind: str) -> None:
    found = address_kind(ip_address(address))
    assert found is not None and kind in found, (address, found)


@pytest.mark.parametrize(("address", "kind"), [
    ("192.0.0.192", "IETF protocol"), ("192.0.0.8", "IETF protocol"),
    ("192.0.0.9", "IETF protocol"), ("192.0.0.171", "IETF protocol"),
    ("192.88.99.1", "6to4 relay"), ("198.51.100.7", "documentation"),
    ("203.0.113.9", "documentation"), ("3fff::1", "documentation"),
    ("2001:db8::1", "documentation"), ("2001::1", "IETF protocol"),
    ("2001:20::1", "IETF protocol"), ("64:ff9b:1::1", "NAT64"), ("100::1", "discard"),
    ("5f00::1", "reserved"), ("4000::1", "reserved"), ("::102:304", "reserved"),
    ("::ffff:192.0.0.192", "IETF protocol"), ("2002:c000:c0::", "IETF protocol"),
    ("64:ff9b::c000:c0", "IETF protocol"),
])
def test_special_purpose_blocks_are_refused_on_any_python(address: str, kind: str) -> None:
    """IANA's special-purpose registries as the app's own table, not Python's `ipaddress`
    (whose tables differ by patch release: before CVE-2024-4032's fix 192.0.0.192, where Oracle
    Cloud's metadata service answers, was `is_global`)."""
    found = address_kind(ip_address(address))
    assert found is not None and kind in found, (address, found)


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111",
                                     "::ffff:8.8.8.8", "100.128.0.1", "2002:808:808::",
                                     "64:ff9b::808:808", "192.31.196.1", "2a00:1450::1"])
def test_public_addresses_are_sent_to(address: str) -> None:
    assert address_kind(ip_address(address)) is None


def test_the_operator_allows_hosts_and_networks() -> None:
    policy = OutboundPolicy.parse("127.0.0.1/32, ::1 [fd00::1] hooks.internal.example,10.1.0.0/16")
    for allowed in ("127.0.0.1", "::1", "fd00::1", "::ffff:127.0.0.1", "10.1.200.3"):
        assert policy.address_refusal(ip_address(allowed), office=ACME, port=80) is None, allowed
    for refused in ("127.0.0.2", "10.2.0.1", "169.254.169.254"):
        why = policy.address_refusal(ip_address(refused), office=ACME, port=80)
        assert why is not None, refused
    assert policy.url_refusal("https://hooks.internal.example/x", ACME) is None
    assert policy.url_refusal("http://HOOKS.internal.example./x", ACME) is None
    # a name not allowed is checked once resolved
    assert policy.url_refusal("http://other.internal.example/x", ACME) is None
    nothing = OutboundPolicy.parse(None)
    for url, why in [("http://127.0.0.1:8/", "loopback"), ("http://[::1]/", "loopback"),
                     ("http://127.1/", "loopback"), ("http://2130706433/", "loopback"),
                     ("http://0x7f.1/", "loopback"), ("http://localhost:9/", "loopback name"),
                     ("http://a.localhost/", "loopback name"), ("ftp://8.8.8.8/", "http and"),
                     ("http://[::ffff:a9fe:a9fe]/", "link-local")]:
        found = nothing.url_refusal(url, ACME)
        assert found is not None and why in found, (url, found)
        assert found.endswith("the operator may allow this host or network in "
                              "VAULTMAIL_OUTBOUND_ALLOW") or why == "http and", found
    for wrong in ("10.0.0.0/33", "bad!host", "127.1", "http://x.example", "1.2.3.4.5"):
        with pytest.raises(ValueError, match=f"VAULTMAIL_OUTBOUND_ALLOW=.*'{wrong}' is none"):
            OutboundPolicy.parse(f"::1,{wrong}")


# -- at send time ------------------------------------------------------------------------------

async def test_nothing_reaches_an_internal_address_unless_the_operator_allows_it(
        receiver: Receiver, tmp_path: Path) -> None:
    keyring = Keyring.in_data_dir(tmp_path)
    names = Names()
    port = receiver.port
    internal = [f"http://127.0.0.1:{port}/hook", "http://169.254.169.254/latest/meta-data/",
                "http://10.0.0.1/hook", f"http://[::1]:{port}/hook",
                f"http://localhost:{port}/hook", f"http://hooks.acme.example:{port}/hook",
                f"http://[::ffff:127.0.0.1]:{port}/hook"]
    strict = OutboundPolicy.parse("", resolver=lambda: names)
    for url in internal:
        with pytest.raises(OutboundRefused) as caught:
            await post_signed(keyring, url, {"n": 1}, outbound=strict, office=ACME, timeout=5)
        assert caught.value.url == url and "VAULTMAIL_OUTBOUND_ALLOW" in str(caught.value)
    assert receiver.got == [], "nothing was sent"
    assert names.asked == ["hooks.acme.example"], "only the name was looked up"

    allowing = OutboundPolicy.parse("127.0.0.1/32 hooks.acme.example", resolver=lambda: names)
    await post_signed(keyring, f"http://127.0.0.1:{port}/hook", {"n": 2}, outbound=allowing,
                      office=ACME)
    await post_signed(keyring, f"http://hooks.acme.example:{port}/named", {"n": 3},
                      outbound=allowing, office=ACME)
    assert receiver.paths() == ["/hook", "/named"]
    # the connection went to the address checked, with the name kept for the receiver
    assert receiver.got[1][1]["Host"] == f"hooks.acme.example:{port}"
    assert names.asked == ["hooks.acme.example"] * 2, "one lookup per request, then pinned"


async def test_a_name_resolving_inside_is_refused_once_resolved(receiver: Receiver,
                                                                tmp_path: Path) -> None:
    names = Names()
    url = f"http://hooks.acme.example:{receiver.port}/hook"
    with pytest.raises(OutboundRefused) as caught:
        await post_signed(Keyring.in_data_dir(tmp_path), url, {},
                          outbound=OutboundPolicy.parse("", resolver=lambda: names), office=ACME)
    assert str(caught.value) == (
        f"{url}: hooks.acme.example resolves to 127.0.0.1, a loopback address: the app sends "
        "only to public addresses; the operator may allow this host or network in "
        "VAULTMAIL_OUTBOUND_ALLOW")
    assert receiver.got == []


async def test_a_metadata_address_in_192_0_0_0_24_is_never_connected_to(
        tmp_path: Path) -> None:
    """192.0.0.192 as a literal, in IPv6 forms and as what a name resolves to: refused before
    any connection, whichever Python runs the app."""
    names = Names("192.0.0.192")
    strict = OutboundPolicy.parse("", resolver=lambda: names)
    for url in ["http://192.0.0.192/latest/meta-data/", "http://[::ffff:c000:c0]/opc/v2/",
                "http://[64:ff9b::c000:c0]/", "http://metadata.acme.example/opc/v2/"]:
        with pytest.raises(OutboundRefused) as caught:
            await post_signed(Keyring.in_data_dir(tmp_path), url, {}, outbound=strict,
                              office=ACME, timeout=5)
        assert "an IETF protocol address" in caught.value.reason, (url, caught.value)
    assert names.asked == ["metadata.acme.example"]


@pytest.mark.parametrize("host", ["1.2.3.4.5", "10.0.0.1.5", "127.0.0.1.", "2130706433.",
                                  "0.", "%31%32%37.0.0.1"])
async def test_a_host_that_is_neither_an_address_nor_a_name_is_never_looked_up(
        receiver: Receiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host: str) -> None:
    """aiohttp takes a host of digits and dots as an address, so it never asks the checked
    resolver: before its fix (PR 12827, in 3.14) it handed the text to the system's own lookup
    (getaddrinfo), whose search domains can make `1.2.3.4.5` `1.2.3.4.5.corp.internal`, an
    internal address behind a wildcard record (here the system answers so). The policy refuses
    such a host itself, at config load and before anything is looked up, whichever aiohttp the
    app runs with."""
    names = Names()
    asked_the_system: list[str] = []
    loop = asyncio.get_running_loop()
    system = loop.getaddrinfo

    async def search_domains(host: Any, port: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host.rstrip(".").replace(".", "").isdigit():
            asked_the_system.append(host)
            host = "127.0.0.1"  # the wildcard record of the operator's search domain
        return await system(host, port, **kwargs)

    monkeypatch.setattr(loop, "getaddrinfo", search_domains)
    url = f"http://{host}:{receiver.port}/hook"
    strict = OutboundPolicy.parse("", resolver=lambda: names)
    try:
        await post_signed(Keyring.in_data_dir(tmp_path), url, {}, outbound=strict,
                          office=ACME, timeout=5)
    except OutboundRefused:
        pass
    except aiohttp.ClientError:  # (a lookup the system answered otherwise: still a failure)
        pass
    assert (receiver.paths(), asked_the_system, names.asked) == ([], [], [])
    assert strict.url_refusal(url, ACME) is not None, url
    with pytest.raises(OutboundRefused, match="neither an address nor a host name"):
        await post_signed(Keyring.in_data_dir(tmp_path), url, {}, outbound=strict,
                          office=ACME, timeout=5)


async def test_a_redirect_is_not_followed(receiver: Receiver, tmp_path: Path) -> None:
    """An allowed receiver answering 307 to another address does not lead the POST there."""
    allowing = OutboundPolicy.parse("127.0.0.1")
    with pytest.raises(RuntimeError, match="answered 307 .redirects are not followed"):
        await post_signed(Keyring.in_data_dir(tmp_path),
                          f"http://127.0.0.1:{receiver.port}/moved", {}, outbound=allowing,
                          office=ACME)
    assert receiver.paths() == ["/moved"], "the redirect's target got nothing"


# -- in the running app ------------------------------------------------------------------------

def _office(dispatch: str, webhooks: list[str]) -> str:
    example = (Path(__file__).resolve().parents[1] / "bot" / "example_office.yml").read_text()
    office = yaml.safe_load(example)
    office["agents"][0]["run"]["dispatch"] = dispatch  # scout
    office["webhooks"] = webhooks
    return yaml.safe_dump(office, sort_keys=False)


async def test_a_pushed_config_with_internal_urls_is_refused_naming_each(
        embedded: Embedded, person: Any, tools: Any, receiver: Receiver) -> None:
    port = receiver.port
    urls = [f"http://127.0.0.1:{port}/runs", "http://169.254.169.254/", "http://10.0.0.1/",
            f"http://[::1]:{port}/hook", f"http://localhost:{port}/hook"]
    embedded.forge.put_file("acme/.github", "vaultmail.yml", _office(urls[0], urls[1:]),
                            pusher="admin")
    await embedded.settle()
    [issue] = await person("admin").issues("acme/.github")
    for key, url, kind in [("agents[0].run.dispatch", urls[0], "a loopback address"),
                           ("webhooks[0]", urls[1], "a link-local address"),
                           ("webhooks[1]", urls[2], "a private address"),
                           ("webhooks[2]", urls[3], "a loopback address"),
                           ("webhooks[3]", urls[4], "a loopback name")]:
        assert f"{CONFIG}: {key}: " in issue["body"] and url in issue["body"], (key, issue)
        assert kind in issue["body"]
    [refused] = await embedded.ledger_events("office.config_refused")
    assert len(refused.data["errors"]) == 5, refused.data
    await tools(MARCO)("mail_send", to="scout", subject="Go", body="run")
    await embedded.settle()
    assert receiver.got == [], "the refused config sent nothing"


@pytest.mark.parametrize("allowed", [False, True], ids=["no allow-list", "allow-list"])
async def test_urls_whose_names_resolve_inside_are_refused_at_send_time_unless_allowed(
        tmp_path: Path, receiver: Receiver, allowed: bool) -> None:
    names = Names()
    run_url = f"http://runner.acme.example:{receiver.port}/runs"
    hook_url = f"http://hooks.acme.example:{receiver.port}/hook"
    (tmp_path / "office.yml").write_text(_office(run_url, [hook_url]))
    allow = "runner.acme.example, hooks.acme.example" if allowed else ""
    emb = await start_embedded(office_path=tmp_path / "office.yml", data_dir=tmp_path / "d",
                               port=0, forge_port=0,
                               outbound=OutboundPolicy.parse(allow, resolver=lambda: names))
    try:
        async with aiohttp.ClientSession() as session:
            sent = (await ToolClient(session, emb, MARCO)(
                "mail_send", to="scout", subject="Go", body="run"))["mail"]
        if allowed:
            await until(lambda: "/runs" in receiver.paths() and "/hook" in receiver.paths())
            hosts = {path: headers["Host"] for path, headers in receiver.got}
            assert hosts["/runs"] == f"runner.acme.example:{receiver.port}"
            return

        async def ledgered(event: str) -> list[ledger.Entry]:
            return await emb.ledger_events(event)

        async def dispatched() -> bool:
            return bool(await ledgered("run.finished"))

        async def hook_refused() -> bool:
            return bool(await ledgered("office.config_refused"))

        await until(dispatched, timeout=15)
        [finished] = await ledgered("run.finished")
        assert finished.subject == sent["ref"] and finished.data["refused"] is True
        assert finished.data["error"].startswith(f"run.dispatch: {run_url}: "
                                                 "runner.acme.example resolves to 127.0.0.1")
        await until(hook_refused, timeout=15)

        async def tried_twice() -> bool:
            row = await cursors.get_cursor(emb.services.store, "acme", hook_url)
            return row is not None and int(row["failures"]) >= 2

        await until(tried_twice, timeout=15)
        [refused] = await ledgered("office.config_refused")  # once, not at every retry
        [error] = refused.data["errors"]
        assert error.startswith(f"{CONFIG}: webhooks[0]: {hook_url}: hooks.acme.example "
                                "resolves to 127.0.0.1, a loopback address"), error
        assert receiver.got == [], "nothing reached the receiver"
    finally:
        await emb.stop()


async def test_vaultmail_up_refuses_an_office_file_with_an_internal_url_before_starting(
        tmp_path: Path) -> None:
    """`up --office FILE` puts FILE on its forge for the app to read back: a URL there that the
    app would refuse stops the start, naming it, unless VAULTMAIL_OUTBOUND_ALLOW allows it."""
    office = tmp_path / "office.yml"
    office.write_text(_office("none", ["http://127.0.0.1:9/hook"]))
    with pytest.raises(OfficeConfigError) as caught:
        await start_embedded(office_path=office, data_dir=tmp_path / "d", port=0, forge_port=0,
                             outbound=OutboundPolicy.parse(""))
    [error] = caught.value.errors
    assert error.startswith(f"{office}: webhooks[0]: Value error, http://127.0.0.1:9/hook: "
                            "127.0.0.1 is a loopback address"), error


async def test_a_run_whose_dispatch_fails_every_try_is_ledgered_failed(
        tmp_path: Path, receiver: Receiver, database_url: str) -> None:
    """A runner that answers 503 to every try: the tries are bounded, each the same delivery,
    and the run's end is ledgered (`run.finished`, failed, with the last answer), as a refused
    dispatch's is. Before, the app logged that it gave up, and the run stayed `queued` for
    good, with nothing in the office's ledger to say it never reached its runner."""
    url = f"http://127.0.0.1:{receiver.port}/down"
    (tmp_path / "office.yml").write_text(_office(url, []))
    emb = await start_embedded(office_path=tmp_path / "office.yml", data_dir=tmp_path / "d",
                               port=0, forge_port=0, database_url=database_url,
                               outbound=OutboundPolicy.parse("127.0.0.1"))
    try:
        async with aiohttp.ClientSession() as session:
            sent = (await ToolClient(session, emb, MARCO)(
                "mail_send", to="scout", subject="Go", body="run"))["mail"]

        async def finished() -> bool:
            return bool(await emb.ledger_events("run.finished"))

        await until(finished, timeout=30)
        [end] = await emb.ledger_events("run.finished")
        assert end.subject == sent["ref"], end
        assert (end.data["tries"], end.data["url"]) == (DISPATCH_ATTEMPTS, url), end.data
        assert "answered 503" in end.data["error"] and "refused" not in end.data, end.data
        deliveries = {headers["X-Vaultmail-Delivery"] for _, headers in receiver.got}
        assert len(receiver.got) == DISPATCH_ATTEMPTS
        assert deliveries == {f"run-{end.data['run']}"}
        [run] = await mails.runs_for(emb.services.store, "scout", org="acme")
        assert run["state"] == "failed"
    finally:
        await emb.stop()


GLOBEX: dict[str, Any] = {
    "org": "globex",
    "humans": [{"email": "hank@globex.com", "login": "hank", "permissions": ["mail.send"]}],
    "agents": [{"slug": "scout", "login": "globex-scout", "person": "hank@globex.com",
                "run": {"triggers": ["mail"], "dispatch": "none"}}],
}


@pytest.mark.parametrize("host", ["127.0.0.1", "runner.acme.example"],
                         ids=["address", "host name"])
async def test_a_receiver_allowed_for_one_office_is_not_reached_for_another(
        tmp_path: Path, receiver: Receiver, database_url: str, host: str) -> None:
    """The operator allows acme's internal runner (`acme=HOST`); globex, installed on the same
    deployment, names the same receiver for its runs and webhooks. acme's requests reach it;
    globex's are refused (an address at config load, a name once resolved) and the receiver
    gets none of them, the refusal worded as any refusal is, naming no other office. Before,
    an entry allowed its host to every org's config: another tenant could make the app send
    to it, on any port and path, and read why it failed in its own ledger."""
    from bot.office.config import parse_office
    from bot.office.seed import seed_office
    from bot.store import api_tokens

    names = Names()
    base = f"http://{host}:{receiver.port}"
    emb = await start_embedded(data_dir=tmp_path / "d", port=0, forge_port=0,
                               database_url=database_url,
                               outbound=OutboundPolicy.parse(f"acme={host}",
                                                             resolver=lambda: names))
    try:
        seed_office(emb.forge, parse_office(yaml.safe_dump(GLOBEX), "globex.yml",
                                            repository=False))
        (app_id,) = emb.forge.state.apps
        emb.forge.install_app(int(app_id), "globex")
        await emb.settle()
        emb.forge.put_file("acme/.github", "vaultmail.yml",
                           _office(f"{base}/acme/runs", [f"{base}/acme/hook"]), pusher="admin")
        globex = {**GLOBEX, "webhooks": [f"{base}/globex/hook"]}
        globex["agents"] = [{**GLOBEX["agents"][0],
                             "run": {"triggers": ["mail"], "dispatch": f"{base}/globex/runs"}}]
        emb.forge.put_file("globex/.github", "vaultmail.yml", yaml.safe_dump(globex),
                           pusher="admin")
        await emb.settle()
        hank = await api_tokens.create_token(emb.services.store, "human:hank@globex.com",
                                             "globex")
        async with aiohttp.ClientSession() as session:
            await ToolClient(session, emb, MARCO)("mail_send", to="scout", subject="Go",
                                                   body="run")
            async with session.post(emb.app_url + "/api/v1/tools/mail_send",
                                    headers={"Authorization": f"Bearer {hank}"},
                                    json={"to": "scout", "subject": "Go", "body": "run"}
                                    ) as resp:
                assert resp.status == 200, await resp.text()
        await emb.settle()

        async def globex_refused() -> list[str]:
            entries = await ledger.entries(emb.services.store, org="globex")
            return [error for e in entries if e.event == "office.config_refused"
                    for error in e.data["errors"]] + [
                e.data["error"] for e in entries if e.event == "run.finished"]

        async def acme_reached_and_globex_refused() -> bool:
            reached = {"/acme/runs", "/acme/hook"} <= set(receiver.paths())
            # a literal address is refused with the config; a name once resolved, for the
            # run and for the webhook each
            return reached and len(await globex_refused()) >= (1 if host[0].isdigit() else 2)

        await until(acme_reached_and_globex_refused, timeout=30)
        why = ("a loopback address: the app sends only to public addresses; the operator may "
               "allow this host or network in VAULTMAIL_OUTBOUND_ALLOW")
        for error in await globex_refused():
            assert f"{base}/globex/" in error and why in error, error
            assert "acme" not in error.replace(".acme.example", ""), error
        assert not [p for p in receiver.paths() if p.startswith("/globex")], receiver.paths()
        if host[0].isdigit():  # its config was refused: the one before (dispatch: none) holds
            [refused] = [e for e in await ledger.entries(emb.services.store, org="globex")
                         if e.event == "office.config_refused"]
            assert "agents[0].run.dispatch" in refused.data["errors"][0], refused.data
    finally:
        await emb.stop()


def test_an_entry_for_one_office_allows_nothing_to_another() -> None:
    policy = OutboundPolicy.parse("Acme=10.0.0.5, acme=hooks.internal.example acme=[fd00::1],"
                                  "192.168.7.0/24")
    for office in (ACME, Behalf("ACME")):
        for allowed in ("10.0.0.5", "fd00::1", "::ffff:10.0.0.5", "192.168.7.1"):
            assert policy.address_refusal(ip_address(allowed), office=office, port=80) is None
        assert policy.allows_host("Hooks.Internal.Example.", office=office, port=443)
        assert policy.url_refusal("http://10.0.0.5:8080/runs", office) is None
    assert policy.address_refusal(ip_address("192.168.7.1"), office=GLOBEX_OFFICE, port=80) is None
    assert not policy.allows_host("hooks.internal.example", office=GLOBEX_OFFICE, port=443)
    nothing = OutboundPolicy.parse("")
    for url in ("http://10.0.0.5:8080/runs", "http://[fd00::1]/", "http://[::ffff:10.0.0.5]/"):
        # refused to globex as if no office were allowed it: nothing says acme is
        refused = policy.url_refusal(url, GLOBEX_OFFICE)
        assert refused == nothing.url_refusal(url, GLOBEX_OFFICE), url
        assert policy.url_refusal(url, GLOBEX_OFFICE) is not None, url
    for wrong in ("bad!org=10.0.0.5", "=10.0.0.5", "acme=", "acme=bad!host", "a=b=10.0.0.5"):
        with pytest.raises(ValueError, match="VAULTMAIL_OUTBOUND_ALLOW="):
            OutboundPolicy.parse(f"acme=::1,{wrong}")


def test_an_entry_with_a_port_allows_that_port_alone() -> None:
    """`host:port`, `[v6]:port`, `network:port`, each for an office or every office: the URL's
    port (else 80 or 443 by scheme) is the one checked; an entry without a port allows every
    port, as before ports could be named."""
    policy = OutboundPolicy.parse("acme=10.0.0.5:8080 acme=[fd00::1]:443, acme=[fd00::/64]:8443,"
                                  "acme=hooks.internal.example:8443 192.168.7.0/24:9000 "
                                  "10.9.9.9 [fd00::2]")
    for url in ("http://10.0.0.5:8080/runs", "https://[fd00::1]/", "https://[fd00::1]:443/",
                "http://[fd00::9]:8443/", "https://hooks.internal.example:8443/x",
                "http://192.168.7.1:9000/", "http://10.9.9.9:5432/", "http://[fd00::2]:1/"):
        assert policy.url_refusal(url, ACME) is None, url
    for url in ("http://10.0.0.5/runs", "http://10.0.0.5:5432/", "https://10.0.0.5/",
                "http://[fd00::1]/", "http://[fd00::9]/", "http://192.168.7.1/",
                "http://10.0.0.5:8080x/"):
        assert policy.url_refusal(url, ACME) is not None, url
    assert policy.url_refusal("http://10.0.0.5:8080/runs", GLOBEX_OFFICE) is not None
    assert policy.url_refusal("http://192.168.7.1:9000/", GLOBEX_OFFICE) is None
    # worded as any refusal: nothing says which port is allowed
    nothing = OutboundPolicy.parse("")
    assert policy.url_refusal("http://10.0.0.5:22/", ACME) == nothing.url_refusal(
        "http://10.0.0.5:22/", ACME)
    assert policy.allows_host("hooks.internal.example", office=ACME, port=8443)
    assert not policy.allows_host("hooks.internal.example", office=ACME, port=443)
    assert policy.address_refusal(ip_address("::ffff:10.0.0.5"), office=ACME, port=8080) is None
    assert policy.address_refusal(ip_address("10.0.0.5"), office=ACME, port=80) is not None
    for wrong in ("10.0.0.5:0", "10.0.0.5:65536", "acme=10.0.0.5:00", "[::1]:99999",
                  "hooks.internal.example:123456789012345678901234567890"):
        named = "VAULTMAIL_OUTBOUND_ALLOW=.*" + re.escape(f"'{wrong}' names no port")
        with pytest.raises(ValueError, match=named):
            OutboundPolicy.parse(f"::1,{wrong}")
    from bot.app.settings import SettingsError, outbound_setting

    with pytest.raises(SettingsError, match="VAULTMAIL_OUTBOUND_ALLOW=.*'acme=10.0.0.5:0'"):
        outbound_setting("acme=10.0.0.5:0")  # the start stops, naming the setting
    for wrong in ("[hooks.internal.example]:80", "[::1]x", "a:b:80",
                  "10.0.0.5:", "acme=10.0.0.5:http", "hooks.internal.example:-1",
                  "10.0.0.5:８０", "acme=:8080"):
        with pytest.raises(ValueError, match="VAULTMAIL_OUTBOUND_ALLOW=.*is none of these"):
            OutboundPolicy.parse(f"::1,{wrong}")


def test_entries_for_every_office_that_reach_inside_are_named() -> None:
    """What `serve` warns of when it serves orgs from their repositories: an entry for every
    office lets each org's config reach it."""
    policy = OutboundPolicy.parse("acme=10.0.0.5, acme=hooks.acme.example, 127.0.0.1, "
                                  "8.8.8.0/24, hooks.internal.example, 0.0.0.0/0, fd00::/8, "
                                  "2a00:1450::/32")
    assert policy.unscoped_inside() == ["hooks.internal.example", "127.0.0.1/32", "0.0.0.0/0",
                                        "fd00::/8"]
    ports = OutboundPolicy.parse("10.0.0.5:8080, [fd00::1]:443 hooks.internal.example:8443")
    assert ports.unscoped_inside() == ["hooks.internal.example:8443", "10.0.0.5/32:8080",
                                       "[fd00::1/128]:443"]
    assert OutboundPolicy.parse("acme=10.0.0.0/8 8.8.8.8").unscoped_inside() == []


async def test_serving_every_org_warns_of_an_entry_for_every_office(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    caplog.set_level(logging.WARNING, logger="vaultmail.web")
    emb = await start_embedded(data_dir=tmp_path / "d", port=0, forge_port=0,
                               outbound=OutboundPolicy.parse("acme=10.9.9.9, 127.0.0.1"))
    await emb.stop()
    [warned] = [r.getMessage() for r in caplog.records if "OUTBOUND_ALLOW" in r.getMessage()]
    assert "every office's config reach 127.0.0.1/32: name the org" in warned, warned
    assert "10.9.9.9" not in warned


async def test_office_check_applies_the_entries_for_the_org_the_file_is(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`vaultmail office check` refuses what the app would: an entry for acme lets acme's file
    name the receiver, not globex's (nor acme's file checked as globex's, `--org globex`)."""
    from tests.test_cli_tools import vaultmail

    monkeypatch.setenv("VAULTMAIL_OUTBOUND_ALLOW", "acme=127.0.0.1")
    acme, globex = tmp_path / "acme.yml", tmp_path / "globex.yml"
    acme.write_text(_office("none", ["http://127.0.0.1:9/hook"]))
    globex.write_text(yaml.safe_dump({**GLOBEX, "webhooks": ["http://127.0.0.1:9/hook"]}))
    code, out, err = await vaultmail("office", "check", str(acme))
    assert code == 0 and "valid" in out, (out, err)
    for argv in ([str(globex)], [str(acme), "--org", "globex"]):
        code, out, err = await vaultmail("office", "check", *argv)
        assert code == 1, (argv, out, err)
        assert "webhooks[0]: Value error, http://127.0.0.1:9/hook: 127.0.0.1 is a loopback " \
               "address" in out, (argv, out)



@pytest.mark.parametrize("host", ["127.0.0.1", "runner.acme.example"],
                         ids=["address", "host name"])
async def test_an_entry_with_a_port_reaches_that_port_alone(
        tmp_path: Path, receiver: Receiver, host: str) -> None:
    """The operator allows acme's runner on its port (`acme=HOST:PORT`); acme's config names
    it, and another port on the same host (a second receiver, as the host's database or admin
    port would be). The runner gets acme's runs and webhook; the other port is refused (an
    address at config load, a name once resolved, before connecting) and gets nothing. Before,
    an entry allowed every port of its host: an office's config could reach any service on it,
    not the one allowed."""
    other = Receiver()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", other.handle)
    names = Names()
    async with served(app) as other_url:
        other.port = int(other_url.rsplit(":", 1)[1])
        allowed, wrong = (f"http://{host}:{receiver.port}", f"http://{host}:{other.port}/hook")
        policy = OutboundPolicy.parse(f"acme={host}:{receiver.port}", resolver=lambda: names)
        office = tmp_path / "office.yml"
        office.write_text(_office(f"{allowed}/runs", [f"{allowed}/hook", wrong]))
        if host[0].isdigit():  # refused with the config, naming the URL
            with pytest.raises(OfficeConfigError) as caught:
                await start_embedded(office_path=office, data_dir=tmp_path / "d0", port=0,
                                     forge_port=0, outbound=policy)
            [error] = caught.value.errors
            assert f"webhooks[1]: Value error, {wrong}: 127.0.0.1 is a loopback address" \
                in error, error
            office.write_text(_office(f"{allowed}/runs", [f"{allowed}/hook"]))
        emb = await start_embedded(office_path=office, data_dir=tmp_path / "d", port=0,
                                   forge_port=0, outbound=policy)
        try:
            async with aiohttp.ClientSession() as session:
                await ToolClient(session, emb, MARCO)("mail_send", to="scout", subject="Go",
                                                       body="run")

            async def served_and_refused() -> bool:
                refused = host[0].isdigit() or bool(
                    await emb.ledger_events("office.config_refused"))
                return {"/runs", "/hook"} <= set(receiver.paths()) and refused

            await until(served_and_refused, timeout=30)
            if not host[0].isdigit():
                [refused] = await emb.ledger_events("office.config_refused")
                [error] = refused.data["errors"]
                assert error.startswith(f"{CONFIG}: webhooks[1]: {wrong}: runner.acme.example "
                                        "resolves to 127.0.0.1, a loopback address"), error
            with pytest.raises(OutboundRefused):  # and so at send time, whatever the config
                await post_signed(Keyring.in_data_dir(tmp_path), wrong, {}, outbound=policy,
                                  office=ACME, timeout=5)
        finally:
            await emb.stop()
        assert other.got == [], "the port not allowed got nothing"


# -- an entry's org is an account, not a login -------------------------------------------------

SQUATTER: dict[str, Any] = {
    "org": "globex",
    "humans": [{"email": "eve@evil.test", "login": "eve", "permissions": ["mail.send"]}],
    "agents": [{"slug": "scout", "login": "evil-scout", "person": "eve@evil.test",
                "run": {"triggers": ["mail"], "dispatch": "none"}}],
}


async def take_globex_over(emb: Any, first: int, app_id: str) -> None:
    """globex's installation `first` gone, and its login another account's now (an org
    deleted, its name taken): eve's, with evil-scout, which installs the App."""
    forge = emb.forge
    forge.uninstall_app(first)
    await emb.settle()
    forge.state.accounts["globex"].id = forge.state.next_id("account")
    forge.add_user("eve", "eve@evil.test")
    forge.set_permission("globex/scout-vault", "eve", "admin")
    forge.set_permission("globex/scout-vault", "evil-scout", "write")
    forge.install_app(int(app_id), "globex", sender="eve")
    await emb.settle()


@pytest.mark.parametrize("host", ["127.0.0.1", "runner.acme.example"],
                         ids=["address", "host name"])
async def test_an_entry_for_an_org_does_not_pass_to_the_next_owner_of_its_login(
        tmp_path: Path, receiver: Receiver, database_url: str, host: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """The operator allows globex's runner (`globex=HOST`, the org by its login). globex is
    deleted, and another account makes an org called globex and installs the App: its config
    names the same receiver. The entry is bound to the account first recorded as globex, so the
    new owner's URLs are refused where another office's are (an address at config load, a
    name once resolved), worded as any refusal, and the receiver gets nothing of theirs; the
    operator is told which entry and what to write. Before, the entry went with the login:
    whoever took it reached the internal hosts allowed for the org that had it."""
    import logging

    from bot.office.config import parse_office
    from bot.office.seed import seed_office
    from bot.store import api_tokens

    caplog.set_level(logging.WARNING)
    names = Names()
    base = f"http://{host}:{receiver.port}"
    emb = await start_embedded(data_dir=tmp_path / "d", port=0, forge_port=0,
                               database_url=database_url,
                               outbound=OutboundPolicy.parse(f"globex={host}",
                                                             resolver=lambda: names))
    try:
        forge = emb.forge
        seed_office(forge, parse_office(yaml.safe_dump(GLOBEX), "globex.yml", repository=False))
        (app_id,) = forge.state.apps
        first = forge.install_app(int(app_id), "globex")
        await emb.settle()
        forge.put_file("globex/.github", "vaultmail.yml",
                       yaml.safe_dump({**GLOBEX, "webhooks": [f"{base}/old/hook"]}),
                       pusher="admin")
        await emb.settle()
        hank = await api_tokens.create_token(emb.services.store, "human:hank@globex.com",
                                             "globex")
        async with aiohttp.ClientSession() as session, session.post(
                emb.app_url + "/api/v1/tools/mail_send",
                headers={"Authorization": f"Bearer {hank}"},
                json={"to": "scout", "subject": "Go", "body": "run"}) as resp:
            assert resp.status == 200, await resp.text()
        await until(lambda: "/old/hook" in receiver.paths(), timeout=30)

        # the login is another account's now, with its own config naming the receiver
        await take_globex_over(emb, first, app_id)
        squatter = {**SQUATTER, "webhooks": [f"{base}/new/hook"]}
        squatter["agents"] = [{**SQUATTER["agents"][0],
                               "run": {"triggers": ["mail"], "dispatch": f"{base}/new/runs"}}]
        forge.put_file("globex/.github", "vaultmail.yml", yaml.safe_dump(squatter),
                       pusher="eve")
        await emb.settle()
        eve = await api_tokens.create_token(emb.services.store, "human:eve@evil.test", "globex")
        async with aiohttp.ClientSession() as session, session.post(
                emb.app_url + "/api/v1/tools/mail_send",
                headers={"Authorization": f"Bearer {eve}"},
                json={"to": "scout", "subject": "Go", "body": "run"}) as resp:
            # (an address: the config is refused as it is read, so the office has none)
            assert resp.status == 200 or (host[0].isdigit() and resp.status == 400
                                          and "is a loopback address" in await resp.text())
        await emb.settle()

        async def refused() -> list[str]:
            entries = await ledger.entries(emb.services.store, org="globex")
            return [error for e in entries if e.event == "office.config_refused"
                    for error in e.data["errors"]] + [
                e.data["error"] for e in entries
                if e.event == "run.finished" and e.data.get("error")]

        async def refused_or_reached() -> bool:
            reached = [p for p in receiver.paths() if p.startswith("/new")]
            return bool(reached) or len(await refused()) >= (1 if host[0].isdigit() else 2)

        await until(refused_or_reached, timeout=30)
        assert not [p for p in receiver.paths() if p.startswith("/new")], receiver.paths()
        why = ("a loopback address: the app sends only to public addresses; the operator may "
               "allow this host or network in VAULTMAIL_OUTBOUND_ALLOW")
        for error in await refused():
            assert f"{base}/new/" in error and why in error, error
        [warned] = {r.getMessage(): r for r in caplog.records
                    if "are bound to forge account" in r.getMessage()}.values()
        entry = f"globex={host}/32" if host[0].isdigit() else f"globex={host}"
        assert f"globex ({entry}) are bound to forge account" in warned.getMessage(), \
            warned.getMessage()
        assert "globex#" in warned.getMessage(), "it says what to write for the new owner"
        assert warned.__dict__["entries"] == [entry]
    finally:
        await emb.stop()


@pytest.mark.parametrize("index", ["this release", "the release before"])
@pytest.mark.parametrize("meanwhile", ["deleted", "renamed"])
async def test_an_entry_for_a_login_another_account_took_while_the_app_was_down_is_not_theirs(
        tmp_path: Path, receiver: Receiver, database_url: str, meanwhile: str, index: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """globex's office ran on an earlier start, before the operator allowed its runner
    (`globex=127.0.0.1`, the org by its login). While the app is down, globex is deleted (or
    renamed initech) and another account makes an org called globex and installs the App; its
    config names the receiver, and the app starts with the entry. The entry is the account's
    the index knew as globex first, bound as the index recorded it: the new owner's config is
    refused as another office's would be, and the operator is told. Before, the entry was
    bound at its first use, which was the new owner's config read at start: whoever took
    the login while no app heard it reached the internal hosts allowed for the org. An index
    the release before left (no login bound until its entries were used) is bound by the
    start's listing to the account it knew, before it records the newcomer's."""
    import logging

    from bot.office.config import parse_office
    from bot.office.seed import seed_office
    from bot.store import api_tokens
    from tests.support import app_key

    caplog.set_level(logging.WARNING)
    base = f"http://127.0.0.1:{receiver.port}"
    first = await start_embedded(data_dir=tmp_path, persist_forge=True, port=0, forge_port=0,
                                 database_url=database_url, app_key=app_key())
    app_port = int(first.app_url.rsplit(":", 1)[1])
    forge = first.forge
    try:
        seed_office(forge, parse_office(yaml.safe_dump(GLOBEX), "globex.yml", repository=False))
        (app_id,) = forge.state.apps
        installed = forge.install_app(int(app_id), "globex")
        await first.settle()
        old = forge.state.accounts["globex"].id
        store = first.services.store
        assert await installations.account_of(store, "globex") == old
        assert await installations.login_entries_holder(store, "globex", 0) == old
        if index == "the release before":
            async with store.transaction() as db:
                await db.execute("DELETE FROM outbound_allow_accounts")
    finally:
        await first.runner.cleanup()  # the app stops; meanwhile, on the forge:
    try:
        if meanwhile == "renamed":
            forge.rename_org("globex", "initech")
        else:
            forge.uninstall_app(installed)
            forge.state.accounts["globex"].id = forge.state.next_id("account")
        squatter = {**SQUATTER, "webhooks": [f"{base}/new/hook"]}
        seed_office(forge, parse_office(yaml.safe_dump(squatter), "globex.yml",
                                        repository=False))
        forge.install_app(int(app_id), "globex", sender="eve")
        new = forge.state.accounts["globex"].id
        assert new != old
        await forge.webhooks_idle()
    finally:
        await forge.stop()
    again = await start_embedded(data_dir=tmp_path, persist_forge=True, port=app_port,
                                 forge_port=0, database_url=database_url, app_key=app_key(),
                                 outbound=OutboundPolicy.parse("globex=127.0.0.1"))
    try:
        eve = await api_tokens.create_token(again.services.store, "human:eve@evil.test",
                                            "globex")
        async with aiohttp.ClientSession() as session, session.post(
                again.app_url + "/api/v1/tools/mail_send",
                headers={"Authorization": f"Bearer {eve}"},
                json={"to": "scout", "subject": "Go", "body": "run"}) as resp:
            # its config is refused as it is read, naming the URL: the office has none
            text = await resp.text()
            assert resp.status == 400 and f"{base}/new/hook" in text, (resp.status, text)
            assert "is a loopback address" in text, text
        await again.settle()
        assert receiver.paths() == []
        [warned] = {r.getMessage(): r for r in caplog.records
                    if "VAULTMAIL_OUTBOUND_ALLOW's entries" in r.getMessage()}.values()
        assert warned.__dict__["bound_account"] == old and warned.__dict__["account"] == new
        assert f"globex#{new}=" in warned.getMessage(), warned.getMessage()
    finally:
        await again.stop()


def test_an_entry_may_name_the_account_its_org_is() -> None:
    """`acme#1234=10.0.0.5`: the entry is for the office whose forge account is 1234, under
    the login acme; `acme=...` for the account its login's entries were bound to at first
    sight (`Behalf.by_login`). Any other holder of the login is refused as another office is."""
    policy = OutboundPolicy.parse("acme#1234=10.0.0.5:8080, ACME#1234=[fd00::1],"
                                  "acme=hooks.internal.example, acme#77=10.7.7.7")
    acme, other = Behalf("acme", 1234, by_login=True), Behalf("acme", 99, by_login=False)
    unknown = Behalf("acme", None, by_login=True)
    assert policy.url_refusal("http://10.0.0.5:8080/runs", acme) is None
    assert policy.url_refusal("http://[fd00::1]/", acme) is None
    assert policy.allows_host("hooks.internal.example", office=acme, port=443)
    assert policy.url_refusal("http://10.7.7.7/", acme) is not None
    nothing = OutboundPolicy.parse("")
    for office in (other, unknown, Behalf("acme", 99, by_login=True)):
        for url in ("http://10.0.0.5:8080/runs", "http://[fd00::1]/"):
            refused = policy.url_refusal(url, office)
            assert refused is not None and refused == nothing.url_refusal(url, office), url
    assert not policy.allows_host("hooks.internal.example", office=other, port=443)
    assert policy.allows_host("hooks.internal.example", office=unknown, port=443)
    assert policy.by_login("ACME") == ["acme=hooks.internal.example"]
    assert policy.by_login("globex") == []
    # `office check`, which cannot ask the forge: as for the account each entry names
    offline = Behalf("acme", None, by_login=True, any_account=True)
    assert policy.url_refusal("http://10.0.0.5:8080/runs", offline) is None
    for wrong in ("acme#=10.0.0.5", "acme#x=10.0.0.5", "acme#0=10.0.0.5", "#12=10.0.0.5",
                  "acme#-1=10.0.0.5", "acme#1#2=10.0.0.5", "acme#１=10.0.0.5"):
        with pytest.raises(ValueError, match="VAULTMAIL_OUTBOUND_ALLOW=.*org#account"):
            OutboundPolicy.parse(f"::1,{wrong}")


@pytest.mark.parametrize(("entry", "meant"), [
    ("::1:8080", ("[::1]:8080", "[::1:8080]")),
    ("acme=2001:db8::5:443", ("acme=[2001:db8::5]:443", "acme=[2001:db8::5:443]")),
    ("fd00::1:2", ("[fd00::1]:2", "[fd00::1:2]")),
])
def test_an_unbracketed_ipv6_address_ending_in_a_port_like_group_stops_the_start(
        entry: str, meant: tuple[str, str]) -> None:
    """`::1:8080` is the address ::1:8080 on every port to `ipaddress`, and ::1 on port 8080
    to whoever wrote it as `host:port`: neither is taken; the error says what to write for
    each."""
    from bot.app.settings import SettingsError, outbound_setting

    with pytest.raises(SettingsError) as caught:
        outbound_setting(f"10.0.0.5, {entry}")
    said = str(caught.value)
    assert said.startswith("VAULTMAIL_OUTBOUND_ALLOW=") and f"{entry!r} is ambiguous" in said
    for form in meant:
        assert form in said, said
    for clear in (meant[0], meant[1], "fd00::1", "::1", "fd00::", "fd00:0:0:0:0:0:0:8080",
                  "2001:db8::/32", "::ffff:10.0.0.5"):
        OutboundPolicy.parse(clear)


def test_a_6to4_network_for_every_office_is_named_at_start() -> None:
    """2002::/16 carries every IPv4 address, private ones among them (2002:a00::/24 is
    10.0.0.0/8): allowed to every office, it reaches inside as 0.0.0.0/0 does."""
    policy = OutboundPolicy.parse("2002::/16, 2002:a00::/24, 2002:808:808::/48, "
                                  "[2002:c0a8:101::/48]:8080, acme=2002::/16")
    assert policy.unscoped_inside() == ["2002::/16", "2002:a00::/24",
                                        "[2002:c0a8:101::/48]:8080"]
