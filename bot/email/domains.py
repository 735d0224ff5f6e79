"""Whose an email domain is: an office's `email: {domain: ...}` is live only once the domain's
owner says so in DNS, as GitHub Pages and mail providers ask. A repository config is written
by whoever installs the App, so without this one org could name another's domain and receive
(or shadow) its mail.

The proof is a TXT record `_vaultmail.<domain>` whose value is `vaultmail-office=<org>`
(`record`). It is looked up through the app's resolver (bot.email.dns; the tests' is a table)
when the office's mail is first handled and again every `PROVEN_FOR` seconds (an unproven
domain every `UNPROVEN_FOR`): at RCPT, and on each round of the outbox. Until it is proven,
mail to the domain is refused at RCPT (`550 5.7.1` naming the record) and none is sent from
it, and the office's ledger says once which record to publish (`office.config_refused`).
Two offices naming one domain: only the one its record names has it.

The operator may vouch for domains itself (VAULTMAIL_SMTP_DOMAINS, `domain=org` pairs: a host
that serves one org, a network without DNS); `vaultmail up`'s example office is vouched for
by the record its embedded resolver adds (bot.app.embedded)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass

from bot.email.auth import DnsError, Resolver

PROVEN_FOR = 300.0
UNPROVEN_FOR = 30.0
# after DNS could not answer for a domain, it is not asked again for this long: each RCPT
# for a domain whose name servers time out held a thread for the resolver's 5 s
FAILING_FOR = 30.0
PREFIX = "_vaultmail."


def record_name(domain: str) -> str:
    return f"{PREFIX}{domain.lower().rstrip('.')}"


def record_value(org: str) -> str:
    return f"vaultmail-office={org.lower()}"


def record(domain: str, org: str) -> str:
    """The record `org` publishes to prove `domain` is its office's, as a zone file says it."""
    return f'{record_name(domain)} TXT "{record_value(org)}"'


@dataclass(frozen=True)
class Proof:
    proven: bool
    why: str  # why not, naming the record to publish; "" when proven


class DomainProofs:
    """Each (org, domain)'s proof, looked up through `resolver` and kept a while."""

    def __init__(self, resolver: Resolver, vouched: Mapping[str, str] | None = None) -> None:
        self.resolver = resolver
        self.vouched = {d.lower().rstrip("."): o.lower() for d, o in (vouched or {}).items()}
        self._known: dict[tuple[str, str], tuple[Proof, float]] = {}
        self._failing: dict[tuple[str, str], float] = {}  # until when DNS is not asked again

    def forget(self) -> None:
        """Look every domain up again at its next use (a record just published)."""
        self._known.clear()
        self._failing.clear()

    async def proof(self, org: str, domain: str) -> Proof:
        """Whether `domain` is `org`'s office's. DnsError when DNS cannot say now and nothing
        is known yet (the caller answers 451: try again later)."""
        org, domain = org.lower(), domain.lower().rstrip(".")
        if domain in self.vouched:
            return self._said(self.vouched[domain] == org, org, domain)
        key, now = (org, domain), time.monotonic()
        known = self._known.get(key)
        if known is not None and known[1] > now:
            return known[0]
        if self._failing.get(key, 0.0) > now:
            if known is not None:
                return known[0]
            raise DnsError(f"{record_name(domain)}: DNS could not answer a moment ago")
        try:
            values = await asyncio.to_thread(self.resolver.txt, record_name(domain))
        except DnsError:
            self._failing[key] = time.monotonic() + FAILING_FOR
            if known is not None:  # DNS failing now: what it said last stays in force
                return known[0]
            raise
        self._failing.pop(key, None)
        found = {v.strip().strip('"').strip().lower() for v in values}
        proof = self._said(record_value(org) in found, org, domain)
        self._known[key] = (proof, now + (PROVEN_FOR if proof.proven else UNPROVEN_FOR))
        return proof

    @staticmethod
    def _said(proven: bool, org: str, domain: str) -> Proof:
        if proven:
            return Proof(True, "")
        return Proof(False, f"{domain} is not proven to be the {org} office's: publish the "
                            f"TXT record {record(domain, org)}")
