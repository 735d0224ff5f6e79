"""Seed a local forge from an office config, as an organisation would be set up (the embedded
default, tests and `vaultmail forge --seed`): the product's knowledge of offices stays here, the
forge only offers generic set-up operations."""

from __future__ import annotations

import yaml

from bot.office.config import Office, load_office, repository_form
from localforge import LocalForge

ADMIN = "admin"


def seed_office(forge: LocalForge, office: Office) -> dict[str, str]:
    """Create the org (owner `admin`), people, agents, vaults, teams and the `.github` repo.

    People are org members with write access to every vault; each agent's account has write
    access to its own vault and read access to the others. Returns {login: PAT}.
    """
    tokens: dict[str, str] = {ADMIN: forge.user_token(ADMIN)}
    forge.add_org(office.org, owner=ADMIN)
    for human in office.humans:
        tokens[human.login] = forge.user_token(human.login)
        acct = forge.state.account(human.login)
        if acct is not None and not acct.email:
            acct.email = human.email
        forge.add_org_member(office.org, human.login)
    for agent in office.agents:
        tokens[agent.login] = forge.user_token(agent.login)
    forge.add_repo(office.org, ".github")
    forge.put_file(f"{office.org}/.github", "vaultmail.yml", office_yaml(office))
    vaults = office.vaults()
    for full_name in vaults:
        owner, _, name = full_name.partition("/")
        if forge.state.account(owner) is None:
            forge.add_org(owner, owner=ADMIN)
        forge.add_repo(owner, name)
    for full_name in vaults:
        for human in office.humans:
            forge.set_permission(full_name, human.login, "write")
    for agent in office.agents:
        own = office.vault_of(agent).lower()
        for full_name in vaults:
            forge.set_permission(full_name, agent.login,
                                 "write" if full_name.lower() == own else "read")
    for team, emails in office.teams.items():
        logins = [h.login for e in emails if (h := office.human(e)) is not None]
        forge.add_team(office.org, team, logins)
    return tokens


_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def office_yaml(office: Office) -> str:
    """The office as its org's `.github/vaultmail.yml` says it: a command the operator's file
    names becomes `dispatch: command` (a repository config may name none)."""
    in_repository, _ = repository_form(office)
    # (libyaml's emitter where built in: a tenth of the pure one's time, the same text)
    return yaml.dump(in_repository.model_dump(mode="json"), Dumper=_DUMPER, sort_keys=False)


def seed_office_file(forge: LocalForge, path: str) -> dict[str, str]:
    """`vaultmail forge --seed FILE`: seed from an office config file."""
    return seed_office(forge, load_office(path))
