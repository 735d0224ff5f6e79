"""Characters that change what a reader sees without being seen themselves: bidi embeddings,
overrides, isolates and marks ("invoice_\u202egnp.exe" reads invoice_exe.png); zero-width
space, joiners, word joiner, invisible operators and the byte-order mark; line and paragraph
separators. The shell shows each as its code point (bot.cli.output), the log's JSON escapes
it (bot.app.logs): one list for both. A zero-width joiner between two pictographs is how an
emoji of several is written (👩‍💻), and hides nothing there: `joins_pictographs`."""

from __future__ import annotations

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
