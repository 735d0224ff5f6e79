"""Text the app posts on the forge for someone else must not @-mention anyone. Pure.

The forge turns `@login` and `@org/team` into a mention (and a notification) when the `@`
starts the text or follows anything but a letter, digit or underscore, and a letter or digit
follows it. The app decides itself whom it mentions (the reach rules: who a comment reaches,
the 20-person limit, only people who can already see the item); text it copies from a tool
call, a comment or a command must add nobody. So every such text goes through
`defuse_mentions`, and the app's own mention list is rendered live next to it.

`defuse_mentions` puts a WORD JOINER (U+2060, invisible, no line break) right after such an
`@`: the text reads the same, but the forge no longer sees a login after the `@`. An `@` after
a letter or digit (`marco@acme.com`) is no mention and stays as it is. The HTML entities for
`@` (`&#64;`, `&#x40;`, `&commat;`), which the forge decodes before it looks for mentions, are
written as a defused `@` too. Applying it twice changes nothing.
"""

from __future__ import annotations

import re

WORD_JOINER = "\u2060"
_ENTITY_AT = re.compile(r"&(?:#0*64|#[xX]0*40|commat);")
# Also an `@` followed by `&`: an entity there could decode to the login's first letter.
_LIVE_AT = re.compile(r"(?<![A-Za-z0-9_])@(?=[A-Za-z0-9&])")


def defuse_mentions(text: str) -> str:
    """`text` with no live @mention left in it (see the module's docstring)."""
    text = _ENTITY_AT.sub("@" + WORD_JOINER, text)
    return _LIVE_AT.sub("@" + WORD_JOINER, text)
