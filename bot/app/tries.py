"""Failed tries with an API token an outsider offers: at the console's sign-in form, or in
`Authorization: Bearer` (the tools, /mcp, console pages). Each costs a lookup in the index,
and nothing else bounded them: past `PER_ADDRESS` failures a minute from one client address
(`bot.app.peers.client_key`: behind a trusted proxy, the client's) every try from it is
refused, 429 with Retry-After, before its token is looked up; at the sign-in form also past
`EVERYONE` failures a minute from all addresses together (a backstop against a flood from many
addresses). Not at the API: there a global budget would let any outsider lock every agent
out, where one address's budget locks out only that address. A success is never counted.

Counted by this process (each replica its own), as `PerAddress` counts: what bounds the work
a stranger's tries make, not a quota. Logged once an address (or everyone) reaches its limit,
and each failure at INFO, with the address and never the token."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Literal, TypeVar

from bot import metrics
from bot.app.peers import PerAddress
from bot.errors import TooManyRequests, Unauthenticated

log = logging.getLogger("vaultmail.tries")

Place = Literal["sign_in", "bearer"]
PER_ADDRESS = 20  # failed tries a minute from one address: a person mistypes a few
EVERYONE = 300  # failed sign-ins a minute from every address together
WINDOW = 60.0
EVERYONE_KEY = "*"  # (no address is written so: `client_key` gives an address or a network)
_BACKSTOPPED: frozenset[Place] = frozenset({"sign_in"})
T = TypeVar("T")


class FailedTries:
    """The failed tries counted per address and, where backstopped, for everyone."""

    def __init__(self, per_address: int = PER_ADDRESS, everyone: int = EVERYONE,
                 window: float = WINDOW, timer: Callable[[], float] = time.monotonic) -> None:
        self.addresses = PerAddress(per_address, window, timer=timer)
        self.everyone = PerAddress(everyone, window, size=1, timer=timer)

    async def looked_up(self, source: str | None, place: Place,
                        look: Callable[[], Awaitable[T]]) -> T:
        """`look()`, a token's lookup, for a try from `source` (a `client_key`): refused
        (TooManyRequests) before it past the limit, and counted when it finds the token
        unknown or revoked (Unauthenticated). `source` None: neither (a token taken once
        already: a long poll's recheck)."""
        if source is None:
            return await look()
        if (refused := self.refusal(source, place)) is not None:
            raise refused
        try:
            return await look()
        except Unauthenticated:
            self.failed(source, place)
            raise

    def refusal(self, address: str, place: Place) -> TooManyRequests | None:
        """The 429 for a try from `address` (a `client_key`) before its token is looked up, or
        None: the try goes on."""
        if self.addresses.spent(address):
            whose = f"from your address ({address})"
            limit = self.addresses.limit
        elif place in _BACKSTOPPED and self.everyone.spent(EVERYONE_KEY):
            whose, limit = "from every address together", self.everyone.limit
        else:
            return None
        metrics.FAILED_TRIES.labels(place, "refused").inc()
        return TooManyRequests(
            f"too many failed tries with an API token {whose}: more than {limit} unknown or "
            f"revoked tokens within a minute. Nothing was looked up; wait a minute "
            f"(Retry-After), then try again with a live token", code="too_many_failures",
            retry_after=self.addresses.window)

    def failed(self, address: str, place: Place) -> None:
        """A token from `address` that is unknown or revoked: counted against it."""
        metrics.FAILED_TRIES.labels(place, "failed").inc()
        log.info("token try failed", extra={"client": address, "place": place})
        # (logged once, by the try that reaches the limit: not once a refused try)
        if self.addresses.admit(address) and self.addresses.spent(address):
            log.warning("token tries refused from an address for a minute",
                        extra={"client": address, "place": place,
                               "limit": self.addresses.limit})
        if (place in _BACKSTOPPED and self.everyone.admit(EVERYONE_KEY)
                and self.everyone.spent(EVERYONE_KEY)):
            log.warning("token sign-ins refused from every address for a minute",
                        extra={"client": address, "place": place,
                               "limit": self.everyone.limit})
