"""Whether a message from outside reaches an agent, and whether it wakes it. Pure, no I/O.

In order, the strictest first: a sender the agent's `email.policy.accept` does not take is
refused (550) where its `otherwise` says so; mail failing DMARC is held, and so is one the
policy does not take where `otherwise` says hold; mail an automaton sent (Auto-Submitted,
Precedence: bulk, a report, a list) is delivered without waking anyone, never answered
automatically (the loop guard over email); and with `wake: false` outside mail wakes no one.
The automaton's marks come after the rest: anyone can write them (they are believed
unsigned), so they may make a delivery quiet and nothing more. An allow-list counts a sender
only when its From domain is authenticated (an aligned SPF or DKIM pass), so a forged From
matches nothing.
"""

from __future__ import annotations

import hashlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from bot.email.auth import Verdicts
from bot.email.message import Inbound
from bot.office.config import Agent, EmailPolicy, Office
from bot.store import rates
from bot.store.db import Store


@dataclass(frozen=True)
class Decision:
    action: Literal["deliver", "quiet", "refuse"]
    reason: str | None = None
    held: bool = False


def policy_of(office: Office, agent: Agent) -> EmailPolicy:
    if office.email is None:
        return EmailPolicy()
    return office.email.policy.get(agent.slug, EmailPolicy())


def accepts(office: Office, policy: EmailPolicy, sender: str) -> bool:
    if policy.accept == "anyone":
        return True
    if policy.accept == "office":
        return office.human(sender) is not None
    domain = sender.rpartition("@")[2]
    for entry in policy.accept:
        if "@" in entry and not entry.startswith("@"):
            if sender == entry:
                return True
        else:
            wanted = entry.lstrip("@")
            if domain == wanted or domain.endswith("." + wanted):
                return True
    return False


def refusing(office: Office, agent: Agent) -> tuple[str, str] | None:
    """What decides whether the agent's policy refuses a message (`decide`): its office and
    `accept`, for a policy that refuses anyone; None for one that refuses no one. Recipients
    of one message share it (bot.email.server): the answer to DATA is all of theirs."""
    policy = policy_of(office, agent)
    if policy.accept == "anyone" or policy.otherwise != "refuse":
        return None
    accept = policy.accept if isinstance(policy.accept, str) else "\n".join(
        sorted(policy.accept))
    return office.org.lower(), accept


def unlearned(verdicts: Verdicts) -> bool:
    """Whether nothing proves the message's From (no aligned SPF or DKIM pass) and DNS could
    not say what its domain's DMARC record asks (`temperror`): it may be a forgery its owner
    asks to reject, and such a verdict is no better than a `fail`. bot.email.server answers
    it 451 4.7.0 (RFC 7489 6.6.3): the sender's server sends it again, and DMARC decides."""
    return verdicts.dmarc == "temperror" and not verdicts.aligned


def decide(office: Office, agent: Agent, message: Inbound, verdicts: Verdicts) -> Decision:
    """The strictest that applies: refused, held, quiet, delivered. (A hold for DMARC came
    before the policy's refusal, so a forged From was delivered, held, where an honest
    stranger was refused; the automaton's marks came first of all, found by review.)"""
    policy = policy_of(office, agent)
    outside = None
    if policy.accept != "anyone" and not (verdicts.aligned and accepts(office, policy,
                                                                       message.sender)):
        what = ("the office only" if policy.accept == "office"
                else ", ".join(policy.accept) if isinstance(policy.accept, list) else "")
        outside = (f"{agent.slug} takes email from {what}, and {message.sender} is not "
                   + ("among them" if verdicts.aligned else
                      "authenticated (no aligned SPF or DKIM pass)"))
        if policy.otherwise == "refuse":
            return Decision("refuse", outside)
    if verdicts.dmarc == "fail":
        return Decision("quiet", f"held: fails DMARC for {verdicts.from_domain} (p="
                                 f"{verdicts.dmarc_policy or 'none'}), its From may be forged;"
                                 " delivered without mail:new, it wakes no agent", held=True)
    if unlearned(verdicts):  # (the listener defers it: never better than a fail here either)
        return Decision("quiet", f"held: the DMARC record of {verdicts.from_domain} could not "
                                 "be looked up and nothing else proves its From, which may be "
                                 "forged; delivered without mail:new, it wakes no agent",
                        held=True)
    if outside is not None:
        return Decision("quiet", f"held: {outside}; delivered without mail:new, it wakes no "
                                 "agent", held=True)
    # (anyone can write these: they may make a delivery quiet, nothing more)
    if message.automatic:
        return Decision("quiet", f"sent by an automaton ({message.automatic}): delivered "
                                 "without mail:new, it wakes no agent")
    if not policy.wake:
        return Decision("quiet", f"{agent.slug}'s email.policy.wake is off: delivered without "
                                 "mail:new")
    return Decision("deliver")


def sender_key(message: Inbound, verdicts: Verdicts) -> str:
    """Who sent `message`, as its rate and its once (new mail, or in a thread) count it: its
    From, marked when an aligned SPF or DKIM pass proves it, so a From anyone can write is
    never the real sender's (nor takes a Message-ID from them: bot.email.intake)."""
    return key_of_sender(message.sender, verdicts.aligned)


def key_of_sender(sender: str, authenticated: bool) -> str:
    """`sender_key` of a message from `sender`, proven (`authenticated`) or not: what a
    mail's meta line records of it (its From, and its verdicts' `aligned`) says it too."""
    return sender + (" (authenticated)" if authenticated else "")


class SenderRate:
    """At most `per_minute` messages a minute from one outside sender to one agent (a mail
    storm is answered 451, try later: the sender's server keeps the messages and sends them
    again, so nothing is lost). Kept per process; `clock` is injectable."""

    WINDOW = 60.0

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute, self.clock = per_minute, clock
        self._seen: dict[tuple[str, str, str], deque[float]] = {}

    def admit(self, org: str, agent: str, sender: str) -> bool:
        """Count one message, or False when the sender is over its rate (nothing counted)."""
        now = self.clock()
        key = (org.lower(), agent, sender)
        seen = self._seen.setdefault(key, deque())
        while seen and seen[0] <= now - self.WINDOW:
            seen.popleft()
        if len(seen) >= self.per_minute:
            return False
        seen.append(now)
        if len(self._seen) > 10_000:  # forget the quiet ones
            self._seen = {k: v for k, v in self._seen.items() if v and v[-1] > now - self.WINDOW}
        return True


class SharedSenderRate:
    """`SenderRate` counted in the index (bot.store.rates), so that every replica counts the
    same messages: a storm spread over the replicas is turned away as one sent to one. An
    authenticated sender's domain (its organisational domain, as alignment counts it) has a
    count of its own per agent too, DOMAIN_TIMES the sender's: whoever holds a domain's SPF or
    DKIM writes as many local parts as it likes, each a sender of its own."""

    WINDOW = 60.0
    # a big provider's many real senders writing to one agent within a minute stay well under
    # five times what one of them may send
    DOMAIN_TIMES = 5

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self.domain_per_minute = per_minute * self.DOMAIN_TIMES

    @staticmethod
    def key(org: str, agent: str, sender: str) -> str:
        return f"email-rate:{org.lower()}/{agent}/{sender.lower()}"

    @staticmethod
    def copy(sender: str, message: Inbound) -> str:
        """What one message is counted as: its sender, Message-ID and the ids it answers,
        hashed: what its delivery is once per (bot.email.intake: new mail by sender and
        Message-ID, a comment by the thread's mail, sender and Message-ID), so a message
        sent again costs nothing and one with the same id sent to another thread is
        counted."""
        return hashlib.sha256("\n".join([sender.lower(), message.message_id,
                                         *message.thread_refs]).encode()).hexdigest()[:32]

    async def admit(self, store: Store, org: str, agent: str, sender: str, *,
                    message: str | None = None) -> bool:
        """Count one message, or False when the sender is over its rate (nothing counted).
        `message` (`copy`): one counted for this agent before is not counted again."""
        return await rates.admit(store, self.key(org, agent, sender), self.per_minute,
                                 self.WINDOW, message=message)

    async def admit_domain(self, store: Store, org: str, agent: str, domain: str, *,
                           message: str | None = None) -> bool:
        """Count one message from an authenticated sender of `domain` (an organisational
        domain), or False when the domain is over its rate (nothing counted)."""
        return await rates.admit(store, f"email-domain-rate:{org.lower()}/{agent}/"
                                        f"{domain.lower()}", self.domain_per_minute,
                                 self.WINDOW, message=message)
