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


def _trusted(address: str, proxies: tuple[Network, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address.strip())
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip.version == net.version and ip in net for net in proxies)


def client_address(request: web.Request, proxies: tuple[Network, ...]) -> str:
    """The address `request` is from, as above ("" when the connection names none)."""
    peer = request.remote or ""
    if not proxies or not _trusted(peer, proxies):
        return peer
    hops = [h.strip() for field in request.headers.getall("X-Forwarded-For", [])
            for h in field.split(",")]
    for hop in reversed(hops):
        if not _trusted(hop, proxies):
            return hop[:64]  # (a proxy's record of whom it heard from: an address)
    return peer


class PerAddress:
    """At most `limit` requests from one client address within `window` seconds of its last
    one admitted, counted by this process: what bounds the work a stranger's flood makes
    (each replica counts its own), not a quota."""

    def __init__(self, limit: int, window: float = 60.0, size: int = 100_000,
                 timer: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self._counts: cachetools.TTLCache[str, int] = cachetools.TTLCache(size, window,
                                                                          timer=timer)

    def admit(self, address: str) -> bool:
        count = self._counts.get(address, 0)
        if count >= self.limit:
            return False
        self._counts[address] = count + 1
        return True
