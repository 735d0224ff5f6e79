"""What an organisation and a person may be called on a forge: one rule for the office config,
the signed header and each office's keys. Pure.

The widest of the forges' rules: GitHub's (letters, digits and hyphens, at most 39; older
accounts end in a hyphen or hold two together, Enterprise managed users end in `_shortcode`),
Gitea's and Forgejo's (also '.' and '_', at most 40: `modules/validation` IsValidUsername, and
MaxSize(40) on the forms that make users and orgs). Always a letter or digit first, and
nothing but those and '-', '.', '_': never a path or markup.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

NAME_MAX: Final = 40
NAME: Final = r"[A-Za-z0-9][A-Za-z0-9._-]{0,39}"  # no anchors: for patterns built on it
OFFICE: Final = r"[a-z0-9][a-z0-9._-]{0,39}"  # an org's name as an office's: lower case
# a name @-mentioned in text: it ends in a letter or digit, so that the '.' or '-' after it
# ends the sentence, not the name (no forge name ends in '.' or '_')
MENTIONED: Final = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_NAME = re.compile(NAME)
RULE: Final = ("letters, digits, '-', '.' and '_', a letter or digit first, at most "
               f"{NAME_MAX} characters")


def is_name(text: str) -> bool:
    """Whether `text` may be an org's or a person's name on a forge."""
    return _NAME.fullmatch(text) is not None


def check_name(text: str, what: str) -> str:
    """`text` if it may be `what` (an organisation, a login); ValueError saying why not."""
    if not is_name(text):
        raise ValueError(f"{text!r} is not {what} on a forge ({RULE}): write it as the "
                         "forge shows it, e.g. acme_corp or john.doe")
    return text


# -- an operator's entry for one org (VAULTMAIL_OUTBOUND_ALLOW, VAULTMAIL_AGENT_COMMANDS) -------

# The org such an entry is for: its login in lower case, and the forge account id it names, or
# None where it names the login alone. A login is not an org: on GitHub an org can be deleted
# or renamed and its login taken by another account, which must not get what the operator set
# for the org before. So an entry by login alone is bound to the first account the index
# recorded under the login, as it records it (bot.store.installations.bind_logins_in; applied
# by bot.app.services.Services.behalf), and `acme#1234` is account 1234's alone.
OrgEntry = tuple[str, int | None]
_ORG_ACCOUNT = re.compile(r"^(?P<org>[^#]*)#(?P<account>[0-9]+)$", re.ASCII)


def org_entry(text: str) -> OrgEntry | None:
    """The org an operator's entry names: `acme` (its login alone) or `acme#1234` (and its
    forge account id, a number from 1), or None when `text` is neither."""
    account: int | None = None
    if "#" in text:
        found = _ORG_ACCOUNT.match(text)
        if found is None or int(found["account"]) == 0:
            return None
        text, account = found["org"], int(found["account"])
    return (text.lower(), account) if is_name(text) else None


@dataclass(frozen=True)
class Behalf:
    """An office as the operator's entries for one org are applied to it: its org (its login
    now), the forge account that holds it now (None where the index does not know it: nothing
    to tell owners apart by), and whether the entries naming the login alone are its
    (`by_login`: false when they are bound to another account, the first the index recorded
    under the login, and, from `Services.behalf`, while no account is known). `any_account`:
    as for the account each entry names (`vaultmail office check`, which cannot ask the
    forge; it sends and runs nothing)."""

    org: str
    account: int | None = None
    by_login: bool = True
    any_account: bool = False

    def is_for(self, entry: OrgEntry) -> bool:
        """Whether an entry for `entry` is this office's: its org, and the account named (an
        account not known is not it), else the one its login's entries are bound to."""
        org, account = entry
        if org != self.org.lower():
            return False
        if self.any_account:
            return True
        return self.account == account if account is not None else self.by_login
