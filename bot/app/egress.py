"""Where the app may send (issue 21): the dispatch URLs and `webhooks:` of an office config
reach public addresses only, unless the operator allows a host or network
(VAULTMAIL_OUTBOUND_ALLOW).

One deployment serves many orgs and each org writes its own config: without this check an
org's admin could have the app POST to the cloud's metadata service, the database, or anything
else only the app's host can reach. A name is resolved once, every address it gives is checked,
and the connection goes to the address checked (the name stays in Host and in TLS's SNI), so a
name that answers otherwise the second time (DNS rebinding) gains nothing. Redirects are not
followed, and no proxy from the environment is used (aiohttp's default), so the address
checked is the one reached.

An entry of VAULTMAIL_OUTBOUND_ALLOW may name the office it is for (`acme=10.0.0.5`): every
check is asked for an office, the one on whose behalf the request goes (the org whose config
names the URL), and another office's entry does not apply to it. Without that, an internal
receiver the operator allowed for one org could be reached by every other org's config: its
ports probed, the answers read back from the ledger.

An entry may also name the port it is for (`acme=10.0.0.5:8080`, `[fd00::1]:8080`): a host
allowed on every port lets a config reach whatever else listens there (its database, an admin
port), not only the receiver the operator meant. The port checked is the one the connection
goes to (the URL's, else 80 or 443 by scheme), at config load and again once resolved.

An entry's org is an account, not a login: on GitHub an org can be deleted and its login taken
by another account, whose config would otherwise reach what was allowed for the org before.
`acme#1234=10.0.0.5` is for the office whose forge account is 1234 (under the login acme);
`acme=10.0.0.5` is bound to the first account the index recorded as acme (`Services.behalf`,
kept in the index), and another account under that login is refused as another office is, as
is any while the index knows no account under it. Each check is told the office's account
(`Behalf`).
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from ipaddress import (
    IPv4Address,
    IPv4Network,
    IPv6Address,
    IPv6Network,
    ip_address,
    ip_network,
)

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from bot.names import Behalf, OrgEntry, org_entry

IPAddress = IPv4Address | IPv6Address
Network = IPv4Network | IPv6Network
ALLOW_SETTING = "VAULTMAIL_OUTBOUND_ALLOW"
_NAT64 = ip_network("64:ff9b::/96")  # an IPv4 address reached through a NAT64 gateway
_METADATA = "where cloud metadata services answer"
# What is not public, from IANA's IPv4 and IPv6 special-purpose address registries (and the
# multicast and reserved space), as the app's own table: Python's `ipaddress` tables differ by
# patch release (before CVE-2024-4032's fix, 192.0.0.192 was `is_global`). A block the registry
# marks globally reachable inside one listed here (192.0.0.9, 2001:20::/28...) is refused all
# the same: no receiver of ours lives there. ::ffff:0:0/96, 64:ff9b::/96 and 2002::/16 are
# judged by the IPv4 address they carry (`_embedded_ipv4`), before this table.
_NOT_PUBLIC: tuple[tuple[IPv4Network | IPv6Network, str], ...] = tuple(
    (ip_network(net), kind) for net, kind in [
        ("0.0.0.0/8", "an unspecified address ('this network')"),
        ("10.0.0.0/8", "a private address"),
        ("100.64.0.0/10", "a carrier-grade NAT address (100.64.0.0/10)"),
        ("127.0.0.0/8", "a loopback address"),
        ("169.254.0.0/16", f"a link-local address ({_METADATA})"),
        ("172.16.0.0/12", "a private address"),
        ("192.0.0.0/24", f"an IETF protocol address (192.0.0.0/24, {_METADATA})"),
        ("192.0.2.0/24", "a documentation address"),
        ("192.88.99.0/24", "a 6to4 relay anycast address"),
        ("192.168.0.0/16", "a private address"),
        ("198.18.0.0/15", "a benchmarking address"),
        ("198.51.100.0/24", "a documentation address"),
        ("203.0.113.0/24", "a documentation address"),
        ("224.0.0.0/4", "a multicast address"),
        ("240.0.0.0/4", "a reserved address"),  # 255.255.255.255, the broadcast, among them
        ("::/128", "the unspecified address"),
        ("::1/128", "a loopback address"),
        ("64:ff9b:1::/48", "a local-use NAT64 address"),
        ("100::/64", "a discard-only address"),
        ("2001::/23", "an IETF protocol address (2001::/23, Teredo among them)"),
        ("2001:db8::/32", "a documentation address"),
        ("3fff::/20", "a documentation address"),
        ("fc00::/7", "a private address (unique local)"),
        ("fe80::/10", "a link-local address"),
        ("fec0::/10", "a site-local address"),
        ("ff00::/8", "a multicast address"),
    ])
_GLOBAL_UNICAST = ip_network("2000::/3")  # all the IPv6 space IANA gives out to be reached
_HOST_NAME = re.compile(r"^(?=.{1,253}$)([a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?\.)*"
                        r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$")
_NUMERIC = re.compile(r"^[0-9a-fx.]+$")  # 127.1, 0x7f.1, 2130706433: IPv4 in legacy forms


_SIX_TO_FOUR = ip_network("2002::/16")  # 6to4: bits 16 to 48 are an IPv4 address
_AMBIGUOUS = re.compile(r"^(?P<address>.*):(?P<group>[0-9]{1,5})$")


# an entry's office: None for every office, else the org it names (bot.names.OrgEntry: its
# login in lower case, and its account id, or None for the account the login is bound to)
Scope = OrgEntry | None


class OutboundRefused(Exception):
    """A request the app will not send: the URL, and why, with what to do."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"{url}: {reason}")
        self.url = url
        self.reason = reason


def _embedded_ipv4(ip: IPv6Address) -> IPv4Address | None:
    """The IPv4 address an IPv6 form carries (mapped ::ffff:a.b.c.d, 6to4, NAT64), if any."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64:
        return IPv4Address(int(ip) & 0xFFFF_FFFF)
    return None


def address_kind(ip: IPAddress) -> str | None:
    """What kind of address `ip` is when the app does not send to it (`a loopback address`),
    or None for a public one."""
    if isinstance(ip, IPv6Address) and (inner := _embedded_ipv4(ip)) is not None:
        kind = address_kind(inner)
        return f"{kind} ({inner}) in an IPv6 form" if kind else None
    kind = next((kind for net, kind in _NOT_PUBLIC
                 if net.version == ip.version and ip in net), None)
    if kind is None and isinstance(ip, IPv6Address) and ip not in _GLOBAL_UNICAST:
        return "a reserved address (outside 2000::/3, IPv6's global unicast space)"
    return kind


def literal_address(host: str) -> IPAddress | None:
    """The address `host` names itself (an IP literal, or IPv4 in a legacy form such as
    127.1 that the system's resolver reads as one), else None for a name."""
    try:
        return ip_address(host.strip("[]"))
    except ValueError:
        pass
    if _NUMERIC.match(host.lower()):
        try:
            return IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def _reaches_inside(net: Network) -> bool:
    """Whether `net` holds an address that is not public (an entry allowing it does something).
    A 6to4 network (2002::/16) is judged by the IPv4 addresses it carries, as its addresses
    are (`address_kind`): 2002::/16 itself carries 10.0.0.0/8 and every other."""
    if isinstance(net, IPv6Network) and not net.subnet_of(IPv6Network("2000::/3")):
        return True
    if isinstance(net, IPv6Network) and net.overlaps(_SIX_TO_FOUR):
        if net.prefixlen <= 16:
            return True
        carried = IPv4Network(((int(net.network_address) >> 80) & 0xFFFF_FFFF,
                               min(net.prefixlen - 16, 32)), strict=False)
        if _reaches_inside(carried):
            return True
    return any(net.version == inner.version and net.overlaps(inner)
               for inner, _ in _NOT_PUBLIC)


def _split_port(target: str, text: str | None, entry: str) -> tuple[str, int | None]:
    """An entry's host or network and the port after it, if any: `[v6]:port` for an IPv6
    address or network (unbracketed, its colons are its own), `host:port` otherwise."""
    if target.startswith("["):
        inside, bracket, after = target[1:].partition("]")
        if not bracket or (after and not after.startswith(":")):
            return target, None  # (refused as no address nor name)
        target, digits = inside, after[1:] if after else None
    elif target.count(":") == 1:
        target, _, digits = target.partition(":")
    else:
        _refuse_ambiguous(target, text, entry)
        return target, None
    if digits is None or not digits.isascii() or not digits.isdigit():
        return target if digits is None else entry, None  # (refused as no address nor name)
    if not 0 < int(digits) <= 65535:
        raise ValueError(
            f"{ALLOW_SETTING}={text!r}: {entry!r} names no port ({digits!r}): a port is 1 to "
            f"65535, after the host (127.0.0.1:8080, hooks.internal.example:8080) or an IPv6 "
            f"address in brackets ([::1]:8080)")
    return target, int(digits)


def _refuse_ambiguous(target: str, text: str | None, entry: str) -> None:
    """An IPv6 address written without brackets whose last group is digits that could be a
    port (`::1:8080`): `ipaddress` reads the address ::1:8080 on every port, whoever wrote it
    may have meant ::1 on port 8080 (`host:port`). Neither is guessed: ValueError says what to
    write for each."""
    found = _AMBIGUOUS.match(target)
    if found is None or "/" in target or not 0 < int(found["group"]) <= 65535:
        return
    address = found["address"]
    try:
        ip_address(target), IPv6Address(address)
    except ValueError:
        return  # (one reading alone is an address: fd00::1, fd00:0:0:0:0:0:0:8080)
    org = entry[:len(entry) - len(target)]  # (`acme=` or `acme#1234=`, as written)
    raise ValueError(
        f"{ALLOW_SETTING}={text!r}: {entry!r} is ambiguous: an IPv6 address whose last group "
        f"({found['group']}) could be a port. Write {org}[{address}]:{found['group']} for "
        f"{address} on port {found['group']}, or {org}[{target}] for the address {target} on "
        f"every port (an IPv6 address with a port is written in brackets)")


def _entry_text(target: str, port: int | None, *, v6: bool = False) -> str:
    """An entry as the operator would write it (10.0.0.5/32:8080, [fd00::/8]:8080)."""
    if port is None:
        return target
    return f"[{target}]:{port}" if v6 else f"{target}:{port}"


def _scope(org: str, text: str | None, entry: str) -> Scope:
    """The office an entry's `org=` (or `org#account=`) names."""
    scope = org_entry(org)
    if scope is None and "#" in org:
        raise ValueError(
            f"{ALLOW_SETTING}={text!r}: {entry!r} should be org#account=host (acme#1234="
            f"10.0.0.5): the org as the forge spells it, and its forge account id, a "
            f"number from 1 ({org!r} is not)")
    if scope is None:
        raise ValueError(
            f"{ALLOW_SETTING}={text!r}: {entry!r} should be org=host or org=network "
            f"(acme=10.0.0.5, or org#account=host), the org as the forge spells it ({org!r} is "
            f"no org)")
    return scope


_HINT = (f"the app sends only to public addresses; the operator may allow this host or "
         f"network in {ALLOW_SETTING}")


@dataclass(frozen=True)
class OutboundPolicy:
    """VAULTMAIL_OUTBOUND_ALLOW: the networks and host names the app may send to besides
    public addresses (for a receiver on the app's own network), each for every office or for
    one (`Scope`: its org, lower case, and the account named, or None for the account the
    login's entries are bound to; None for all), on one port or every port (None). A host
    name allowed is allowed whatever it resolves to: the operator trusts its DNS."""

    networks: tuple[tuple[Scope, Network, int | None], ...] = ()
    hosts: frozenset[tuple[Scope, str, int | None]] = frozenset()
    # how names are resolved: aiohttp's default resolver, or the one a test gives
    resolver: Callable[[], AbstractResolver] | None = field(default=None, compare=False)

    @classmethod
    def parse(cls, text: str | None, *,
              resolver: Callable[[], AbstractResolver] | None = None) -> OutboundPolicy:
        """Entries separated by commas or spaces: an address (127.0.0.1, ::1, [::1]), a
        network (10.0.0.0/8) or a host name (hooks.internal.example), each on every port or on
        the one that follows it (127.0.0.1:8080, [::1]:8080, 10.0.0.0/8:8080), each for every
        office, or for one office when its org comes first (acme=10.0.0.5:8080), with its
        forge account id (acme#1234=10.0.0.5) or without (bound to the first account the
        index recorded under the login). ValueError names the entry that is none of these,
        or an IPv6 address without brackets that may end in a port (`::1:8080`)."""
        networks: list[tuple[Scope, Network, int | None]] = []
        hosts: set[tuple[Scope, str, int | None]] = set()
        for entry in (e for e in re.split(r"[\s,]+", text or "") if e):
            org, eq, target = entry.rpartition("=")
            office = _scope(org, text, entry) if eq else None
            target, port = _split_port(target, text, entry)
            try:
                networks.append((office, ip_network(target.strip("[]"), strict=False), port))
                continue
            except ValueError:
                pass
            if "[" in entry:  # brackets hold an IPv6 address or network, nothing else
                target = "[]"
            name = target.lower().rstrip(".")
            if (not _HOST_NAME.match(name) or literal_address(name) is not None
                    or name.rpartition(".")[2].isdigit()):
                raise ValueError(
                    f"{ALLOW_SETTING}={text!r}: should be addresses (127.0.0.1, ::1), networks "
                    f"(10.0.0.0/8) or host names (hooks.internal.example), each on every port "
                    f"or on one (127.0.0.1:8080, [::1]:8080), for every office or for one "
                    f"(acme=10.0.0.5), separated by commas ({entry!r} is none of these)")
            hosts.add((office, name, port))
        return cls(tuple(networks), frozenset(hosts), resolver)

    def by_login(self, org: str) -> list[str]:
        """The entries naming `org` by its login alone (`acme=10.0.0.5`), as written: those
        bound to the first account the index recorded under the login."""
        scope = (org.lower(), None)
        return sorted({f"{org.lower()}={_entry_text(name, port)}"
                       for office, name, port in self.hosts if office == scope}
                      | {f"{org.lower()}={_entry_text(str(net), port, v6=net.version == 6)}"
                         for office, net, port in self.networks if office == scope})

    def unscoped_inside(self) -> list[str]:
        """The entries for every office that let a request reach what is not public (any host
        name: a public one needs no entry): on a deployment serving several orgs, each lets
        every org's config reach it, so `serve` warns of them."""
        found = sorted(_entry_text(name, port) for office, name, port in self.hosts
                       if office is None)
        return found + [_entry_text(str(net), port, v6=net.version == 6)
                        for office, net, port in self.networks
                        if office is None and _reaches_inside(net)]

    @staticmethod
    def _applies(scope: Scope, office: Behalf, allowed: int | None, port: int) -> bool:
        if allowed not in (None, port):
            return False
        # the org's office: the account named, else the one the login's entries are bound to
        return scope is None or office.is_for(scope)

    def allows_host(self, host: str, *, office: Behalf, port: int) -> bool:
        """Whether the operator allowed the name `host` on `port` for `office`."""
        name = host.lower().rstrip(".")
        return any(self._applies(scope, office, allowed_port, port)
                   for scope, allowed, allowed_port in self.hosts if allowed == name)

    def address_refusal(self, ip: IPAddress, *, office: Behalf, port: int) -> str | None:
        """Why `ip` may not be reached on `port` on `office`'s behalf (`a private address`),
        or None. The reason is the same whether or not another office, or another port, is
        allowed: an office is not told what the others are allowed, nor the config where the
        operator's receiver listens."""
        if isinstance(ip, IPv6Address) and ip.scope_id:
            ip = IPv6Address(ip.compressed.split("%")[0])
        forms: list[IPAddress] = [ip]
        if isinstance(ip, IPv6Address) and (inner := _embedded_ipv4(ip)) is not None:
            forms.append(inner)
        if any(form.version == net.version and form in net
               for form in forms for scope, net, allowed in self.networks
               if self._applies(scope, office, allowed, port)):
            return None
        return address_kind(ip)

    def url_refusal(self, url: str, office: Behalf) -> str | None:
        """Why `url` may not be sent to on `office`'s behalf, from the URL alone (its scheme,
        an address it names and its port, a `localhost` name), or None: at config load and
        again before each request; a name is checked once resolved (`session`)."""
        try:
            parsed = URL(url)
            port = parsed.port  # the URL's, else the scheme's (80, 443): where it connects
        except (ValueError, TypeError):
            return "not a URL"
        if parsed.scheme not in ("http", "https"):
            return "only http and https URLs are sent to"
        host = parsed.raw_host
        if not host:
            return "the URL names no host"
        if port is None:
            return "not a URL"
        if self.allows_host(host, office=office, port=port):
            return None
        ip = literal_address(host)
        if ip is not None:
            kind = self.address_refusal(ip, office=office, port=port)
            return f"{host} is {kind}: {_HINT}" if kind else None
        name = host.lower().rstrip(".")
        # digits and dots that are no address (1.2.3.4.5, 127.0.0.1.) are no name either: an
        # HTTP client may take them for an address and hand them to the system's lookup,
        # never to the checked resolver (aiohttp did before its fix, PR 12827, in 3.14), and
        # its search domains may answer with an internal address
        if not _HOST_NAME.match(name) or name.rpartition(".")[2].isdigit():
            return f"{host} is neither an address nor a host name"
        if name == "localhost" or name.endswith(".localhost"):
            return f"{host} is the app's own host (a loopback name): {_HINT}"
        return None

    def url_refusal_offline(self, url: str, org: str) -> str | None:
        """`url_refusal` for `org` without asking the forge whose account it is, as for the
        account each entry for `org` names (`vaultmail office check`, `up`'s check of its
        file before it starts: nothing is sent on it; the app checks again when it reads the
        config, for the account the org is)."""
        return self.url_refusal(url, Behalf(org, any_account=True))

    def session(self, url: str, *, office: Behalf, timeout: float) -> aiohttp.ClientSession:
        """A session for requests to `url` alone on `office`'s behalf: OutboundRefused now if
        the URL names what may not be reached, or at connect time if its name resolves to
        such an address."""
        why = self.url_refusal(url, office=office)
        if why is not None:
            raise OutboundRefused(url, why)
        inner = self.resolver() if self.resolver is not None else aiohttp.DefaultResolver()
        connector = aiohttp.TCPConnector(
            resolver=_CheckedResolver(self, inner, url, office), use_dns_cache=False)
        return aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=timeout))


class _CheckedResolver(AbstractResolver):
    """Resolves a name once and refuses it if any address it gives may not be reached on the
    port it gives; the connector then connects to exactly these addresses and ports."""

    def __init__(self, policy: OutboundPolicy, inner: AbstractResolver, url: str,
                 office: Behalf) -> None:
        self._policy, self._inner, self._url, self._office = policy, inner, url, office

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        for result in found:
            # the port of each result is the one connected to (the URL's, as asked)
            if self._policy.allows_host(host, office=self._office, port=result["port"]):
                continue
            kind = self._policy.address_refusal(ip_address(result["host"]), office=self._office,
                                                port=result["port"])
            if kind is not None:
                raise OutboundRefused(self._url,
                                      f"{host} resolves to {result['host']}, {kind}: {_HINT}")
        return found

    async def close(self) -> None:
        await self._inner.close()
