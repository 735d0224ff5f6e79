"""The office config (DESIGN §3.2): who works here, their vaults, permissions and capabilities.

Pure: parsing and validation only. Errors name the file, the key and why, all at once.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

HumanPermission = Literal["mail.send", "editor"]
RunKind = Literal["mail", "chat"]

_SLUG = re.compile(r"^[a-z0-9][a-z0-9-]{0,38}$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_REPO = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")


class OfficeConfigError(ValueError):
    """An office config that cannot be used; `errors` lists every problem as 'file: key: why'."""

    def __init__(self, source: str, errors: list[str]) -> None:
        self.source = source
        self.errors = errors
        super().__init__(f"invalid office config {source}:\n  " + "\n  ".join(errors))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Human(_Strict):
    email: str
    login: str
    permissions: list[HumanPermission] = Field(default_factory=list)

    @field_validator("email")
    @classmethod
    def _email(cls, v: str) -> str:
        if not _EMAIL.match(v):
            raise ValueError(f"{v!r} is not an email address")
        return v.lower()

    @property
    def principal(self) -> str:
        return f"human:{self.email}"


class RunConfig(_Strict):
    triggers: list[RunKind] = Field(default_factory=lambda: list[RunKind](["mail"]))
    dispatch: str = "none"

    @field_validator("dispatch")
    @classmethod
    def _dispatch(cls, v: str) -> str:
        if v in ("none", "repository_dispatch") or v.startswith(("http://", "https://")):
            return v
        raise ValueError("must be none, repository_dispatch, or an http(s) URL")


class Agent(_Strict):
    slug: str
    login: str
    person: str | None = None
    vault: str | None = None
    run: RunConfig = Field(default_factory=RunConfig)
    capabilities: dict[str, list[str]] = Field(default_factory=dict)

    @field_validator("slug")
    @classmethod
    def _slug(cls, v: str) -> str:
        if not _SLUG.match(v):
            raise ValueError("must be lowercase letters, digits and dashes (at most 39)")
        return v

    @field_validator("vault")
    @classmethod
    def _vault(cls, v: str | None) -> str | None:
        if v is not None and not _REPO.match(v):
            raise ValueError("must be owner/repo")
        return v

    @property
    def principal(self) -> str:
        return f"agent:{self.slug}"

    def may_mail(self, recipient_slug: str) -> bool:
        allowed = self.capabilities.get("mail.send", [])
        return "*" in allowed or recipient_slug in allowed


class Office(_Strict):
    org: str
    vault_pattern: str = "{slug}-vault"
    humans: list[Human] = Field(default_factory=list)
    teams: dict[str, list[str]] = Field(default_factory=dict)
    agents: list[Agent] = Field(default_factory=list)
    webhooks: list[str] = Field(default_factory=list)

    @field_validator("vault_pattern")
    @classmethod
    def _pattern(cls, v: str) -> str:
        if "{slug}" not in v:
            raise ValueError("must contain {slug}")
        return v

    @model_validator(mode="after")
    def _cross_refs(self) -> Office:
        emails = {h.email for h in self.humans}
        slugs = [a.slug for a in self.agents]
        problems: list[str] = []
        if len(set(slugs)) != len(slugs):
            problems.append("agents: slugs must be unique")
        logins = [h.login for h in self.humans] + [a.login for a in self.agents]
        if len(set(logins)) != len(logins):
            problems.append("logins must be unique across humans and agents")
        for team, members in self.teams.items():
            for m in members:
                if m.lower() not in emails:
                    problems.append(f"teams.{team}: {m} is not one of the humans")
        for i, a in enumerate(self.agents):
            if a.person is not None and a.person.lower() not in emails:
                problems.append(f"agents[{i}].person: {a.person} is not one of the humans")
            for who in a.capabilities.get("mail.send", []):
                if who != "*" and who not in slugs:
                    problems.append(f"agents[{i}].capabilities.mail.send: no agent {who!r}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    # -- lookups -------------------------------------------------------------------------
    def vault_of(self, agent: Agent) -> str:
        return agent.vault or f"{self.org}/{self.vault_pattern.format(slug=agent.slug)}"

    def agent(self, slug: str) -> Agent | None:
        return next((a for a in self.agents if a.slug == slug), None)

    def human(self, email: str) -> Human | None:
        return next((h for h in self.humans if h.email == email.lower()), None)

    def by_login(self, login: str) -> Human | Agent | None:
        people: list[Human | Agent] = [*self.humans, *self.agents]
        return next((who for who in people if who.login.lower() == login.lower()), None)

    def agent_for_vault(self, full_name: str) -> Agent | None:
        return next((a for a in self.agents if self.vault_of(a).lower() == full_name.lower()), None)

    def vaults(self) -> list[str]:
        return [self.vault_of(a) for a in self.agents]


def _locate(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def parse_office(text: str, source: str = "office.yml") -> Office:
    """Parse and validate; raise OfficeConfigError listing every problem with its location."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise OfficeConfigError(source, [f"{source}: not valid YAML: {exc}"]) from exc
    if not isinstance(raw, dict):
        raise OfficeConfigError(source, [f"{source}: (top level): must be a mapping with org:"])
    try:
        return Office.model_validate(raw)
    except ValidationError as exc:
        errors = [f"{source}: {_locate(e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise OfficeConfigError(source, errors) from exc


def load_office(path: str | Path | None = None) -> Office:
    """Load an office file, or the built-in example office when path is None."""
    if path is None:
        text = resources.files("bot").joinpath("example_office.yml").read_text()
        return parse_office(text, "built-in example office")
    p = Path(path)
    return parse_office(p.read_text(), str(p))
