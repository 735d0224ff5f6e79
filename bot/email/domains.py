"""Whose an email domain is: an office's `email: {domain: ...}` is live only once the domain's
owner says so in DNS, as GitHub Pages and mail providers ask. A repository config is written
by whoever installs the App, so without this one org could name another's domain and receive
(or shadow) its mail.

The proof is a TXT record `_vaultmail.<domain>` whose value is `vaultmail-office-id=<id>`,
the forge's id of the office's org (`record`): what a rename keeps, and what an org made under
the name of one deleted or renamed away does not have. It is looked up through the app's
resolver (bot.email.dns; the tests' is a table) when the office's mail is first handled and
again every `PROVEN_FOR` seconds (an unproven domain every `UNPROVEN_FOR`): at RCPT, and on
each round of the outbox. Until it is proven,
mail to the domain is refused at RCPT (`550 5.7.1` naming the record) and none is sent from
it (the outbox defers its messages, and gives them up on a deferral's clock: never sent late),
and the office's ledger says once which record to publish (`office.config_refused`).
Two offices naming one domain: only the one its record names has it.

The record asked for before ids, `vaultmail-office=<org>` (`named_value`), names the org by
name: it still proves the domain, but only for an org that held that name, as the same
account, when the index was upgraded to proofs by id (bot.store.domain_proofs): never for an
org the index learns of after, and never for whichever account is asked first. So a record
left published for an org deleted or renamed away proves nothing for another org made under
its name; and after a rename it proves nothing for the renamed org either (it names the id).

The operator may vouch for domains itself (VAULTMAIL_SMTP_DOMAINS, `domain=org` pairs: a host
that serves one org, a network without DNS); `vaultmail up`'s example office is vouched for
by the record its embedded resolver adds (bot.app.embedded). A vouch names an account, as a
record does: `domain=acme#1234`, or `domain=acme` bound to the first account the index
recorded under the login (bot.names.Behalf, Services.behalf: the rule of
VAULTMAIL_OUTBOUND_ALLOW and VAULTMAIL_AGENT_COMMANDS), so an org made again under the login
by another account has the domain unproven, as any other office naming it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass

from bot.email.auth import DnsError, Resolver
from bot.names import Behalf, OrgEntry, org_entry
from bot.store import domain_proofs
from bot.store.db import Store

PROVEN_FOR = 300.0
UNPROVEN_FOR = 30.0
# after DNS could not answer for a domain, it is not asked again for this long: each RCPT
# for a domain whose name servers time out held a thread for the resolver's 5 s
FAILING_FOR = 30.0
PREFIX = "_vaultmail."
Key = tuple[str, int | None, str]  # (org, its account, domain)


def record_name(domain: str) -> str:
    return f"{PREFIX}{domain.lower().rstrip('.')}"


def record_value(account: int | str) -> str:
    """The value naming the office whose org is `account` on the forge (an id; or words
    standing for one not known here)."""
    return f"vaultmail-office-id={account}"


def value_for(org: str, account: int | None) -> str:
    """`record_value` of `org`'s account; words saying which id goes there when not known."""
    return record_value(f"<the id of {org.lower()} on the forge>" if account is None
                        else account)


def named_value(org: str) -> str:
    """The value asked for before ids, naming the org by name (see the module's words)."""
    return f"vaultmail-office={org.lower()}"


def record(domain: str, org: str, account: int | None) -> str:
    """The record proving `domain` the office's of `org`, the forge's account `account`, as
    a zone file says it."""
    return f'{record_name(domain)} TXT "{value_for(org, account)}"'


@dataclass(frozen=True)
class Proof:
    proven: bool
    why: str  # why not, naming the record to publish; "" when proven


class DomainProofs:
    """Each (org, its account, domain)'s proof, looked up through `resolver` and kept a
    while; the orgs a record naming its org may prove a domain for are read from `store`."""

    def __init__(self, resolver: Resolver, store: Store,
                 vouched: Mapping[str, str] | None = None) -> None:
        self.resolver, self.store = resolver, store
        self.vouched: dict[str, OrgEntry] = {}
        for domain, org in (vouched or {}).items():
            entry = org_entry(org)
            if entry is None:  # (the settings stop the start on one: bot.app.settings)
                raise ValueError(f"{domain}={org}: not an org, nor org#account")
            self.vouched[domain.lower().rstrip(".")] = entry
        self._known: dict[Key, tuple[Proof, float]] = {}
        self._failing: dict[Key, float] = {}  # until when DNS is not asked again

    def forget(self) -> None:
        """Look every domain up again at its next use (a record just published)."""
        self._known.clear()
        self._failing.clear()

    async def proof(self, office: Behalf, domain: str) -> Proof:
        """Whether `domain` is the office's of `office.org`, the forge's account
        `office.account` (None: not known yet). DnsError when DNS cannot say now and nothing
        is known yet (the caller answers 451: try again later)."""
        org, account, domain = office.org.lower(), office.account, domain.lower().rstrip(".")
        if domain in self.vouched:  # (the operator's word, for an account: its host, its orgs)
            return self._said(office.is_for(self.vouched[domain]), org, account, domain)
        key, now = (org, account, domain), time.monotonic()
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
        if account is not None and record_value(account) in found:
            proof = Proof(True, "")
        elif named_value(org) in found:
            proof = await self._named(org, account, domain)
        else:
            proof = self._said(False, org, account, domain)
        self._known[key] = (proof, now + (PROVEN_FOR if proof.proven else UNPROVEN_FOR))
        return proof

    async def _named(self, org: str, account: int | None, domain: str) -> Proof:
        """The proof of a record naming `org` by name: the domain is the office's when its
        account held that name before proofs by id. An account not known yet proves
        nothing: whether it is that one is not known."""
        if account is not None and \
                await domain_proofs.held_before_ids(self.store, org, account):
            return Proof(True, "")
        return Proof(False, f"{record_name(domain)} names {org} by name, which proves "
                            f"{domain} only for an org that had that name before offices "
                            f"were proven by id: {_publish(account, org, domain)}")

    @staticmethod
    def _said(proven: bool, org: str, account: int | None, domain: str) -> Proof:
        if proven:
            return Proof(True, "")
        return Proof(False, f"{domain} is not proven to be the {org} office's: "
                            f"{_publish(account, org, domain)}")


def _publish(account: int | None, org: str, domain: str) -> str:
    return f"publish the TXT record {record(domain, org, account)}"
