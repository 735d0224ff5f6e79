"""Everything the `vaultmail` command prints goes through here: `say` for people, `say_json`
for scripts (`--json`).

Much of what people read was written by someone else: a comment on the forge, another
principal's mail or chat, a key in a pull request's office config, a forge's error message.
A terminal acts on the control characters in such text (a window retitled, the screen
cleared, a line overwritten by a carriage return, the clipboard set by OSC 52), so `say` shows
them instead: a C0 control as its Unicode control picture (ESC as ␛), DEL as ␡, a C1 control
as `\\x9b`; newlines and tabs stay, and a CRLF line end (GitHub's web editor writes them) is a
line end. Text can also fool the eye without a control character: a bidi override or isolate
reorders what follows ("invoice_\u202egnp.exe" reads invoice_exe.png), a zero-width character
hides inside a name, a line or paragraph separator breaks a line some terminals draw; `say`
shows each as its code point (`<U+202E>`); a zero-width joiner too, but between two
pictographs, where it writes an emoji of several (👩‍💻: `bot.unseen.joins_pictographs`). JSON needs
none of this: `json.dumps` escapes every control character but DEL, which it is made to
escape too, and all that is not ASCII. (ruff's T20 refuses `print` elsewhere in bot/cli.)
"""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from bot.unseen import UNSEEN, ZWJ, joins_pictographs

_SHOWN = ({c: chr(0x2400 + c) for c in range(0x20) if chr(c) not in "\n\t"}
          | {0x7F: "\u2421"} | {c: f"\\x{c:02x}" for c in range(0x80, 0xA0)}
          | {c: f"<U+{c:04X}>" for c in UNSEEN})


def shown(text: str) -> str:
    """`text` with its control and unseen characters shown, not acted on (newlines and tabs
    kept, and a joiner within an emoji)."""
    parts = text.replace("\r\n", "\n").split(ZWJ)
    out = [parts[0].translate(_SHOWN)]
    for before, after in zip(parts, parts[1:], strict=False):
        out += [ZWJ if joins_pictographs(before, after) else _SHOWN[ord(ZWJ)],
                after.translate(_SHOWN)]
    return "".join(out)


def say(text: str, *, file: TextIO | None = None, flush: bool = False) -> None:
    """Print a line (or lines) for people, on stdout or `file`."""
    print(shown(text), file=file or sys.stdout, flush=flush)


def say_json(value: Any) -> None:
    """Print `value` as one line of JSON for scripts: every control character escaped (DEL
    too, which `json.dumps` leaves), the text itself unchanged."""
    print(json.dumps(value).replace("\x7f", "\\u007f"))
