"""Characters that change what a reader sees without being seen themselves: bidi embeddings,
overrides, isolates and marks ("invoice_\u202egnp.exe" reads invoice_exe.png); zero-width
space, joiners, word joiner, invisible operators and the byte-order mark; line and paragraph
separators. The shell shows each as its code point (bot.cli.output), the log's JSON escapes
it (bot.app.logs): one list for both."""

from __future__ import annotations

UNSEEN = (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C,
          *range(0x200B, 0x200E), *range(0x2060, 0x2065), 0xFEFF, 0x2028, 0x2029)
