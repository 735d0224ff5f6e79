"""Who a comment reaches (seed: "Who a comment reaches"), and whether personally or through
their agents.

Everything here is per principal: `human:<email>` is a person, `agent:<slug>` an agent whose
inbox is its person's "agents" inbox. A person reached for any personal reason is reached
personally (mentioned in the forge, so the forge notifies them); a person whose agents alone
are reached is reached only through them, and is never pinged.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from bot.errors import InvalidArguments

if TYPE_CHECKING:  # (annotations only: the index loads this module, not the office's models)
    from bot.office.config import Office

Way = Literal["personal", "agents"]
MAX_ADDRESSED = 20


@dataclass(frozen=True)
class Reached:
    principal: str  # a person (personal) or an agent (through its person's agents)
    way: Way

    def as_json(self) -> dict[str, str]:
        return {"principal": self.principal, "way": self.way}


def person_of(office: Office, principal: str) -> str | None:
    """The person behind a principal: a human is their own; an agent has its `person`."""
    if principal.startswith("human:"):
        return principal
    if principal.startswith("agent:"):
        agent = office.agent(principal.removeprefix("agent:"))
        if agent is not None and agent.person:
            return f"human:{agent.person.lower()}"
    return None


def in_office(office: Office, principal: str) -> bool:
    """Whether a person or agent is in the office's config now; anyone else (the office
    itself, a forge account) is not one it can leave."""
    if principal.startswith("human:"):
        return office.human(principal[6:]) is not None
    if principal.startswith("agent:"):
        return office.agent(principal[6:]) is not None
    return True


def gone_from(office: Office, principals: Iterable[str],
              names: dict[str, str] | None = None) -> dict[str, str]:
    """Those of `principals` who have left the office, each by the name people knew them by:
    `names` (their login in the config before), else an agent's slug or the part of a
    person's email before the @ (never the whole address: it is shown on the forge)."""
    known = names or {}
    return {p: known.get(p) or p.partition(":")[2].partition("@")[0]
            for p in dict.fromkeys(principals) if not in_office(office, p)}


def owner_of(office: Office, principal: str) -> str:
    """Whose inbox a principal's deliveries land in: its person, or itself without one."""
    return person_of(office, principal) or principal


def agents_of(office: Office, person: str) -> list[str]:
    email = person.removeprefix("human:")
    return [a.principal for a in office.agents if a.person and a.person.lower() == email]


def way_of_writer(principal: str) -> Way:
    """Someone who wrote themselves is reached personally; an agent that wrote, through it."""
    return "agents" if principal.startswith("agent:") else "personal"


def resolve(office: Office, entries: Iterable[str], *, author: str,
            claim: str | None, field: str) -> list[Reached]:
    """`to` / `cc` entries as principals: emails, team:<key>, "agent", "me", agent:<slug>."""
    out: list[Reached] = []
    for raw in entries:
        entry = raw.strip()
        low = entry.lower()
        if low == "me":
            person = person_of(office, author) if author.startswith("agent:") else None
            if person is None:
                raise InvalidArguments(
                    f'{field}: "me" means the person of the agent writing; {author} has none. '
                    "Address people by email instead.")
            out.append(Reached(person, "personal"))
        elif low == "agent":
            if claim is None:
                raise InvalidArguments(
                    f'{field}: "agent" means the agent holding the outcome\'s claim, and no '
                    "agent is assigned to it; address a person by email instead.")
            out.append(Reached(claim, "agents"))
        elif low.startswith("team:"):
            key = entry[5:].strip()
            if key not in office.teams:
                known = ", ".join(sorted(office.teams)) or "none"
                raise InvalidArguments(f"{field}: no team {key!r}; teams: {known}")
            out += [Reached(f"human:{m.lower()}", "personal") for m in office.teams[key]]
        elif low.startswith("agent:"):
            if office.agent(low[6:]) is None:
                raise InvalidArguments(f"{field}: no agent {low[6:]!r} in this office")
            out.append(Reached(low, "agents"))
        else:
            email = low.removeprefix("human:")
            if office.human(email) is None:
                raise InvalidArguments(
                    f"{field}: {entry!r} is not anyone in this office; use a person's email, "
                    'team:<key>, "agent" (the agent holding the claim) or "me"')
            out.append(Reached(f"human:{email}", "personal"))
    return out


def check_addressed(reached: list[Reached]) -> None:
    """At most 20 people (a team counts as its members), so nobody broadcasts by comment."""
    people = len({r.principal for r in reached})
    if people > MAX_ADDRESSED:
        raise InvalidArguments(f"to/cc: {people} people; at most {MAX_ADDRESSED}. Address fewer "
                               "people, or post where the rest already follow the work")


@dataclass(frozen=True)
class Table:
    """The item's part of the reach table, looked up by the service before computing."""

    kind: str
    plan_author: str | None  # principal of a plan's author, on a plan
    claim: str | None  # agent holding the outcome's claim (outcome, or its plan/evidence)


def table_reach(table: Table) -> list[Reached]:
    out: list[Reached] = []
    if table.kind == "plan" and table.plan_author:
        out.append(Reached(table.plan_author, way_of_writer(table.plan_author)))
    if table.kind in ("outcome", "plan", "evidence") and table.claim:
        out.append(Reached(table.claim, "agents"))
    return out


def audience(office: Office, *, author: str, candidates: Iterable[Reached],
             explicit: Iterable[str] = ()) -> list[Reached]:
    """Who hears a comment: people reached for a personal reason are reached personally (and
    pinged); agents reached put it in their person's agents inbox, which never pings anyone.

    The author never reaches themselves, and an agent writing does not reach its own person
    unless it addresses them (`cc: ["me"]`): nobody wants to hear about their agents' work.
    Someone who has left the office (a thread they were in) hears nothing more."""
    mine = person_of(office, author) if author.startswith("agent:") else None
    wanted = set(explicit)
    personal: dict[str, None] = {}
    through: dict[str, None] = {}
    for r in candidates:
        if r.principal == author or (r.principal == mine and r.principal not in wanted) \
                or not in_office(office, r.principal):
            continue
        if r.way == "personal" and r.principal.startswith("human:"):
            personal[r.principal] = None
        else:
            through[r.principal] = None
    return [*(Reached(p, "personal") for p in personal),
            *(Reached(p, "agents") for p in through if p not in personal)]
