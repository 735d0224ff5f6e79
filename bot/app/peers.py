"""Whom a request is from: the connecting address, or, when that is a proxy the operator
trusts (VAULTMAIL_TRUSTED_PROXIES: an ingress, a load balancer), the address that proxy heard
from. Each proxy appends whom it heard from to X-Forwarded-For, so the list is read from its
right end, past the trusted proxies, to the first address that is not one: everything left
of it is what the client wrote itself, anyone's to forge. Limits counted per address (OAuth
client registrations) count clients, not the ingress everyone comes through."""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable

import cachetools
from aiohttp import web

from bot.app.settings import Network

IP = ipaddress.IPv4Address | ipaddress.IPv6Address


def _ip(address: str) -> IP | None:
    try:
        ip = ipaddress.ip_address(address.strip())
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _trusted(ip: IP | None, proxies: tuple[Network, ...]) -> bool:
    return ip is not None and any(ip.version == net.version and ip in net for net in proxies)


def client_address(request: web.Request, proxies: tuple[Network, ...]) -> str:
    """The address `request` is from, as above ("" when the connection names none). A hop a
    trusted proxy wrote that is no address counts as the proxy's own."""
    peer = request.remote or ""
    if not from_trusted_proxy(request, proxies):
        return peer
    hops = [h for field in request.headers.getall("X-Forwarded-For", [])
            for h in field.split(",")]
    for hop in reversed(hops):
        ip = _ip(hop)
        if ip is None:
            return peer
        if not _trusted(ip, proxies):
            return str(ip)
    return peer


def from_trusted_proxy(request: web.Request, proxies: tuple[Network, ...]) -> bool:
    """Whether `request` came through a proxy the operator trusts: its X-Forwarded-* headers
    are the proxy's word; from anyone else, the client's own."""
    return _trusted(_ip(request.remote or ""), proxies)


def reached_at(request: web.Request, proxies: tuple[Network, ...]) -> tuple[str, str]:
    """The scheme and host the client reached the app at: the request's own, or what a trusted
    proxy says in X-Forwarded-Proto and X-Forwarded-Host (a TLS-terminating ingress speaks
    http to the app). Of a list, the last: what the proxy nearest the app wrote; a client's
    own before it is never taken."""
    scheme, host = request.scheme, request.host
    if from_trusted_proxy(request, proxies):
        proto = _last(request, "X-Forwarded-Proto").lower()
        scheme = proto if proto in ("http", "https") else scheme
        host = _last(request, "X-Forwarded-Host") or host
    return scheme, host


def _last(request: web.Request, header: str) -> str:
    values = [v.strip() for field in request.headers.getall(header, []) for v in field.split(",")]
    return values[-1] if values else ""


def client_key(request: web.Request, proxies: tuple[Network, ...]) -> str:
    """What limits per address count a request under: its client's address, or for IPv6 the
    /64 it is in (a host is given a /64 as commonly as one IPv4 address: per address, one
    host had 2^64 counts of its own)."""
    return address_key(client_address(request, proxies))


def address_key(address: str) -> str:
    """What limits per address count a client `address` under (`client_key`): the address,
    or for IPv6 the /64 it is in."""
    ip = _ip(address)
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip) if ip is not None else address


class PerAddress:
    """At most `limit` requests from one client address within `window` seconds of its last
    one admitted, counted by this process: what bounds the work a stranger's flood makes
    (each replica counts its own), not a quota."""

    def __init__(self, limit: int, window: float = 60.0, size: int = 100_000,
                 timer: Callable[[], float] = time.monotonic) -> None:
        self.limit, self.window = limit, window  # (a refused client may come back after it)
        self._counts: cachetools.TTLCache[str, int] = cachetools.TTLCache(size, window,
                                                                          timer=timer)

    def spent(self, address: str) -> bool:
        """Whether `address` has no request left now (nothing counted)."""
        return self._counts.get(address, 0) >= self.limit

    def admit(self, address: str) -> bool:
        count = self._counts.get(address, 0)
        if count >= self.limit:
            return False
        self._counts[address] = count + 1
        return True
