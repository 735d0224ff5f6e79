"""Characters that change what a reader sees without being seen themselves: bidi embeddings,
overrides, isolates and marks ("invoice_\u202egnp.exe" reads invoice_exe.png); zero-width
space, joiners, word joiner, invisible operators and the byte-order mark; line and paragraph
separators. The shell shows each as its code point (bot.cli.output), the log's JSON escapes
it (bot.app.logs): one list for both. A zero-width joiner between two pictographs is how an
emoji of several is written (👩‍💻), and hides nothing there: `joins_pictographs`."""

from __future__ import annotations

import re
import unicodedata

UNSEEN = (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C,
          *range(0x200B, 0x200E), *range(0x2060, 0x2065), 0xFEFF, 0x2028, 0x2029)

ZWJ = "\u200d"
# what may stand between a pictograph and the joiner after it: a variation selector (❤️),
# a skin tone (👩🏽)
_EMOJI_MARKS = "\ufe0e\ufe0f" + "".join(map(chr, range(0x1F3FB, 0x1F400)))


def _pictograph(c: str) -> bool:
    # an emoji's category is So (Symbol, other); the planes of emoji kept for new ones too
    return unicodedata.category(c) == "So" or 0x1F000 <= ord(c) <= 0x1FFFD


def joins_pictographs(before: str, after: str) -> bool:
    """Whether a joiner between `before` and `after` joins two pictographs (👩 and 💻 in
    👩‍💻), not letters, nor the end of a word."""
    ends = before.rstrip(_EMOJI_MARKS)
    return bool(ends) and bool(after) and _pictograph(ends[-1]) and _pictograph(after[0])


# Where a person reads a subject (the issue title, the inbox, the ledger) it must read as what
# it is: control characters (tab, newline, C1) become spaces; characters that are invisible or
# reorder the text around them (bidi embeddings, overrides, isolates and marks, zero-width
# space, word joiner, BOM, soft hyphen, Hangul fillers, tag characters, ...) are removed. The
# zero-width (non-)joiners that emoji sequences and scripts such as Persian need are kept.
_SUBJECT_SPACE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_SUBJECT_INVISIBLE = re.compile(
    "[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180e\u200b\u200e\u200f"
    "\u202a-\u202e\u2060-\u206f\u3164\ufeff\uffa0\ufff9-\ufffb"
    "\U0001d173-\U0001d17a\U000e0000-\U000e0fff]")


def clean_subject(subject: str) -> str:
    """The subject the app signs and titles the issue with (see above); may be empty. (Here,
    not in bot.mail.header: the questions, which opening the index loads, need it, and that
    module's pydantic and cryptography are for those that sign or read headers.)"""
    return _SUBJECT_INVISIBLE.sub("", _SUBJECT_SPACE.sub(" ", subject)).strip()
