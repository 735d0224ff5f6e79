"""Email addresses: who an address reaches in which office, and the principal an outside
sender acts as. Pure, no I/O."""

from __future__ import annotations

import re
from dataclasses import dataclass
from email.headerregistry import Address
from email.utils import getaddresses, parseaddr

from bot.office.config import Agent, Office

# one address as the app accepts it: ASCII, no spaces, control or quoting characters, one @,
# a dotted domain, no `=?` (which the email package would decode as an RFC 2047 encoded-word
# when the address is written in a header); what could add a header line or a Markdown
# construct is refused here
_ADDRESS = re.compile(r"^(?!.*=\?)[A-Za-z0-9.!#$%&'*+/=?^_{}~-]{1,64}"
                      r"@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+$")
MAX_ADDRESS = 254


class BadAddress(ValueError):
    """Not an address the app takes: the message says why."""


def normalise(address: str) -> str:
    """`address` lower-cased and checked, or BadAddress."""
    text = address.strip().strip("<>").strip()
    if len(text) > MAX_ADDRESS or not _ADDRESS.match(text):
        raise BadAddress(f"{address[:80]!r} is not an email address this server takes")
    return text.lower()


def principal_of(address: str) -> str:
    """The principal an outside sender acts as: `email:<address>`, whatever name it gave."""
    return f"email:{normalise(address)}"


def address_of(principal: str) -> str | None:
    """The address of an `email:` principal, None for anyone else."""
    return principal.removeprefix("email:") if principal.startswith("email:") else None


def header_address(value: str | None) -> str | None:
    """The one address of a From-like header, normalised, or None when there is none that
    the app takes."""
    if not value:
        return None
    _, addr = parseaddr(value)
    try:
        return normalise(addr) if addr else None
    except BadAddress:
        return None


def header_addresses(*values: str | None) -> list[str]:
    """Every address the To/Cc-like headers name that the app takes, in order, once each."""
    out: list[str] = []
    for _, addr in getaddresses([v for v in values if v]):
        try:
            found = normalise(addr)
        except BadAddress:
            continue
        if found not in out:
            out.append(found)
    return out


@dataclass(frozen=True)
class Mailbox:
    """Where an address of an office leads: its office and agent."""

    office: Office
    agent: Agent
    address: str  # as the app writes it: <slug>@<domain>

    @property
    def domain(self) -> str:
        assert self.office.email is not None
        return self.office.email.domain


def agent_address(office: Office, agent: Agent) -> str | None:
    """The agent's own address (`<slug>@<domain>`), None when the office has no email."""
    return f"{agent.slug}@{office.email.domain}" if office.email is not None else None


def mailbox(offices: list[Office], address: str) -> Mailbox | None:
    """The agent `address` reaches in one of `offices` (its slug or an alias at the office's
    domain; a `+tag` after the local part is ignored), or None."""
    try:
        addr = normalise(address)
    except BadAddress:
        return None
    local, _, domain = addr.rpartition("@")
    local = local.split("+", 1)[0]
    for office in offices:
        if office.email is None or office.email.domain != domain:
            continue
        for agent in office.agents:
            if local == agent.slug or local in office.email.aliases.get(agent.slug, []):
                return Mailbox(office, agent, agent_address(office, agent) or addr)
    return None


def display(address: str, name: str) -> str:
    """A From/To header value, its name quoted as RFC 5322 wants (never a header break)."""
    local, _, domain = address.partition("@")
    clean = re.sub(r"[\x00-\x1f\x7f]", " ", name).strip()
    return str(Address(display_name=clean, username=local, domain=domain))
