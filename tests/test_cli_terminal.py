"""What the CLI prints for people reaches an operator's terminal, and much of it was written by
someone else: a comment on the forge, another principal's mail or chat, a key in a pull
request's office config. A terminal acts on the control characters in it (a window retitled,
the screen cleared, lines overwritten, the clipboard set by OSC 52), so every line printed for
people shows them instead (bot.cli.output); `--json` stays the exact text, escaped by JSON."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp

from bot.app.embedded import Embedded
from bot.cli.output import shown
from tests.support import Actor
from tests.test_cli_tools import vaultmail

# a window title (OSC 0, ended by BEL), red (CSI), the clipboard (OSC 52), a carriage return
# that would overwrite the line, DEL, and CSI as one C1 character
PAYLOAD = ("\x1b]0;TITLE-BY-LEE\x07\x1b[41mRED\x1b[0m \x1b]52;c;cm0gLXJmIH4=\x07"
           "hidden\rshown \x7f \x9b2J")
SHOWN = "␛]0;TITLE-BY-LEE␇␛[41mRED␛[0m ␛]52;c;cm0gLXJmIH4=␇hidden␍shown ␡ \\x9b2J"
RAW = [chr(c) for c in range(0x20) if chr(c) not in "\n\t"] + [chr(c) for c in range(0x7f, 0xa0)]


def _raw_controls(text: str) -> list[str]:
    return sorted({c for c in text if c in RAW})


def test_bidi_overrides_and_invisible_characters_are_shown() -> None:
    """A right-to-left override makes "exe.gnp" read "png.exe" (and reorders a whole line of
    someone's words), a zero-width space or joiner hides in a name, a line separator breaks a
    line some terminals draw: the operator sees each as its code point."""
    assert shown("invoice_\u202egnp.exe") == "invoice_<U+202E>gnp.exe"
    hidden = ("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
              "\u200b\u200c\u200d\u2060\ufeff\u2028\u2029")
    assert shown(f"a{hidden}b") == "a" + "".join(f"<U+{ord(c):04X}>" for c in hidden) + "b"
    # what people write stays as written: accents, scripts, emoji
    assert shown("café مرحبا 👩‍💻") == "café مرحبا 👩‍💻"


async def test_an_emojis_joiner_reaches_the_terminal_as_the_emoji_a_hidden_one_shown(
        embedded: Embedded) -> None:
    """A zero-width joiner is how an emoji of several is written (👩‍💻 is 👩, the joiner, 💻;
    🏳️‍🌈 and 👩🏽‍💻 with a variation selector or a skin tone before it). `vaultmail show`
    printed each as 👩<U+200D>💻. Now a joiner between two pictographs is the emoji; one
    beside a letter, or at either end of a word, still hides something and is shown."""
    data = ["--data", str(embedded.data_dir)]
    emoji = "👩\u200d💻 🏳\ufe0f\u200d🌈 👩🏽\u200d💻 ❤\ufe0f\u200d🔥"
    hiding = "pay\u200dpal \u200dx y\u200d 👩\u200da a\u200d💻"
    code, out, err = await vaultmail("send", "scout", "Team", "-", "--as", "builder", *data,
                                     stdin=f"{emoji} | {hiding}")
    assert code == 0, err
    code, out, err = await vaultmail("show", out.split()[0], "--as", "scout", *data)
    assert code == 0, err
    assert emoji in out, out
    assert ("pay<U+200D>pal <U+200D>x y<U+200D> 👩<U+200D>a a<U+200D>💻") in out, out


def test_control_characters_are_shown_and_lines_and_tabs_kept() -> None:
    assert shown(PAYLOAD) == SHOWN
    # a forge's CRLF line ends (GitHub's web editor writes them) are line ends, not ␍
    assert shown("a\tb\r\nc\n") == "a\tb\nc\n"


async def test_a_comment_a_mail_and_a_chat_reach_the_terminal_shown(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    data = ["--data", str(embedded.data_dir)]
    code, out, err = await vaultmail("send", "scout", "Spec", "-", "--as", "builder", *data,
                                     stdin=f"builder says {PAYLOAD}")
    assert code == 0, err
    ref = out.split()[0]
    repo, number = ref.split("#")
    await Actor(session, embedded, "lee").comment(repo, int(number), f"lee says {PAYLOAD}")
    code, out, err = await vaultmail("chat", "scout", f"marco asks {PAYLOAD}", "--as", "marco",
                                     *data)
    assert code == 0, err
    await embedded.settle()

    code, out, err = await vaultmail("show", ref, "--as", "scout", *data)
    assert code == 0, err
    assert _raw_controls(out + err) == [], out
    assert f"builder says {SHOWN}" in out and f"lee says {SHOWN}" in out, out

    code, out, err = await vaultmail("inbox", "--as", "scout", *data)
    assert code == 0, err
    assert _raw_controls(out + err) == [], out
    assert f"marco asks {SHOWN}" in out, out

    # --json is for scripts: the exact text, JSON's escapes keeping the terminal safe
    code, out, err = await vaultmail("show", ref, "--as", "scout", *data, "--json")
    assert code == 0, err
    assert _raw_controls(out) == [], out
    assert json.loads(out)["result"]["mail"]["body"] == f"builder says {PAYLOAD}"


async def test_office_check_shows_a_key_from_a_pull_request(tmp_path: Path) -> None:
    bad = tmp_path / "vaultmail.yml"
    bad.write_text('org: "acme\\e]0;PWNED\\a\\e[2J"\nhumans: []\nagents: []\n'
                   '"evil\\e[31m": 1\n')
    code, out, err = await vaultmail("office", "check", str(bad))
    assert code == 1, (out, err)
    assert _raw_controls(out + err) == [], (out, err)
    assert "evil␛[31m" in out, out
