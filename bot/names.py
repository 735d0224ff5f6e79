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
