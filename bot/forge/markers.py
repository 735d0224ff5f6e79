"""The app's markers: hidden HTML comments (`<!-- vaultmail:KIND PART ... -->`) by which it
finds again what it wrote on the forge (a retried write's comment, a note said once).

Content is data. A marker is built only of the app's own tokens (`marker` refuses any other
part; a value someone chose -- an idempotency key, a Message-ID, a name -- goes in as its
digest, `token`), and it is found only as a whole comment of a body (`carries`), never as a
substring. Someone's words the app posts have every `<!--` disarmed (`as_data`,
`render_inbound`), so no text of theirs can open, close or hold one: a reply whose key read
`k --> <!-- vaultmail:tampered ID` made the app's reply comment carry the tamper warning's
marker, and the warning was taken as posted (review r3)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator

# a part: letters and digits, then those and `._:=@+-` (no space, no `<` or `>`: no part can
# end the comment or start another)
_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:=@+-]*")


def token(text: str, size: int = 32) -> str:
    """The digest that stands for `text` (someone's choice) in a marker."""
    return hashlib.sha256(text.encode()).hexdigest()[:size]


def marker(kind: str, *parts: str) -> str:
    """`<!-- vaultmail:KIND PART ... -->`; ValueError for a part that is no token of the
    app's (`token` it first)."""
    for part in (kind, *parts):
        if not _PART.fullmatch(part):
            raise ValueError(f"not a marker part: {part[:40]!r} (use markers.token)")
    return f"<!-- vaultmail:{' '.join((kind, *parts))} -->"


def comments(body: str) -> Iterator[str]:
    """Each HTML comment of `body`, whole (`<!--` to the first `-->` after it), in order:
    one scan, however many `<!--` it holds."""
    start = body.find("<!--")
    while start >= 0:
        end = body.find("-->", start + 4)
        if end < 0:
            return
        yield body[start:end + 3]
        start = body.find("<!--", end + 3)


def carries(body: str, marker: str) -> bool:
    """Whether `marker` is one of `body`'s HTML comments, whole: not inside a longer one."""
    return marker in body and any(c == marker for c in comments(body))


def found_in(body: str, marker: str) -> bool:
    """What `Forge.find_issue` looks for: a marker as `carries` finds it; a mail id as text,
    the header that names it judged by the caller's `accept` (`headed_by`)."""
    return carries(body, marker) if marker.startswith("<!--") else marker in body


def reply(key: str) -> str:
    """The marker of the reply comment the app posts for reply `key` (`Mailer.reply`)."""
    return marker("reply", token(key))


def legacy_reply(key: str) -> str:
    """What releases before review r3 wrote for reply `key`, the key as it was: still looked
    for (`carries`, so a key that closed the comment never matches), never written, so a
    reply posted before an upgrade is found after it (its retry, its email, the doctor)."""
    return f"<!-- vaultmail:reply {key} -->"


def without_reply(body: str, key: str) -> str:
    """`body`, the app's comment of reply `key`, with its marker (either form) taken off."""
    body = body.rstrip()
    for m in (reply(key), legacy_reply(key)):
        body = body.removesuffix(m)
    return body.rstrip()


def is_reply(body: str, key: str) -> bool:
    """Whether `body` is the app's comment of reply `key`: its marker last, as the app puts
    it (one carrying it elsewhere holds someone's words)."""
    body = body.rstrip()
    return any(body.endswith(m) and carries(body, m) for m in (reply(key), legacy_reply(key)))
