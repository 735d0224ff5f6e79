"""An office config is another org's text, read in the one process every office shares: what
it may make the host build is bounded before it is built (review r4: a few KB of YAML whose
aliases repeat one list made pydantic copy it n³ times), and an alias-free one past the
documented limits is refused naming the limit, the key and the line."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from importlib import resources
from typing import Any

import pytest

from bot.app.embedded import Embedded
from bot.office.config import OfficeConfigError, parse_office

MIB = 1024 * 1024


def _example() -> str:
    return resources.files("bot").joinpath("example_office.yml").read_text()


def _errors(text: str) -> list[str]:
    with pytest.raises(OfficeConfigError) as caught:
        parse_office(text, "vaultmail.yml", repository=True)
    return caught.value.errors


def _alias_bomb(n: int) -> str:
    """Review r4's file: agent b, repeated n times by `*B`, has n capabilities, each `*L`, one
    list of n strings: n³ entries once expanded, from n² bytes."""
    shared = "&L [" + ", ".join(f"s{i}" for i in range(n)) + "]"
    caps = "{" + ", ".join(f"c{i}: *L" for i in range(n)) + "}"
    lines = ["org: acme", "humans:", "  - {login: alice, email: alice@acme.test}", "agents:",
             f"  - &A {{slug: a, login: a-bot, capabilities: {{c: {shared}}}}}",
             f"  - &B {{slug: b, login: b-bot, capabilities: {caps}}}"]
    return "\n".join(lines + ["  - *B"] * (n - 2)) + "\n"


def test_an_alias_bomb_is_refused_before_it_is_expanded() -> None:
    """n=200: 4.5 KB that expands to 8 million list entries (68 MB held while pydantic copied
    them, ~8 GB at n=1000) before it was refused for its duplicate slugs. The values it
    expands to are counted as it is read, and it is refused at the alias that takes the count
    past the limit, having built nothing: what it allocates (tracemalloc's peak) stays small."""
    text = _alias_bomb(200)
    assert len(text) < 5_000
    tracemalloc.start()
    try:
        errors = _errors(text)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    [error] = errors
    assert error.startswith("vaultmail.yml: holds more than 250,000 values once its aliases "
                            "are expanded (*B repeats"), error
    line = int(error.rsplit("(line ", 1)[1].split(",")[0])
    assert text.splitlines()[line - 1] == "  - *B", error
    assert peak < 8 * MIB, f"{peak:,} bytes allocated to refuse it"


def test_a_value_that_holds_itself_is_refused_at_its_alias() -> None:
    """`&a [*a]` is a list inside itself: PyYAML builds it (a cycle), which no walk over the
    config's values would finish; it is refused where the alias is."""
    [error] = _errors("org: acme\nagents: &a [{slug: a, login: a-bot}, *a]\n")
    assert error == ("vaultmail.yml: *a is inside &a, a value that holds itself: write it "
                     "out instead (line 2, column 38)"), error


def _agents(n: int) -> str:
    return "org: acme\nagents:\n" + "".join(
        f"  - {{slug: a{i}, login: a{i}-bot}}\n" for i in range(n))


def _humans(n: int) -> str:
    return "org: acme\nhumans:\n" + "".join(
        f"  - {{email: p{i}@acme.test, login: p{i}}}\n" for i in range(n))


def _long_list(n: int) -> str:
    return _example().replace('mail.send: ["*", ', "mail.send: [" + "".join(
        f"a{i}, " for i in range(n)) + '"*", ')


def _many_values(n: int) -> str:
    """12 values, then `n` list entries, in capabilities of 10,000 entries each (within the
    limit of one list): 2 values more for each (its key and its list)."""
    per = 10_000
    return "org: acme\nagents:\n  - slug: a\n    login: a-bot\n    capabilities:\n" + "".join(
        f"      c{t}: [" + ", ".join("x" for _ in range(min(per, n - t * per))) + "]\n"
        for t in range(-(-n // per)))


def _big(n: int) -> str:
    return _example() + "# " + "x" * (n - len(_example()) - 3) + "\n"


@pytest.mark.parametrize(("make", "at_limit", "key", "why"), [
    (_agents, 1_000, "agents",
     "1,001 agents (a vault each), more than the 1,000 an office may have"),
    (_humans, 10_000, "humans", "10,001 people, more than the 10,000 an office may have"),
    (_long_list, 10_000 - 3, "agents[0].capabilities.mail.send",
     "10,001 entries, more than the 10,000 one list or mapping may hold"),
    (_many_values, 250_000 - 12 - 2 * 25, "",
     "holds more than 250,000 values (keys, values and list entries)"),
    (_big, 2 * MIB, "", "more than 2,097,152 bytes (2 MiB)"),
], ids=["agents", "people", "list", "values", "bytes"])
def test_a_config_past_a_limit_is_refused_naming_it(
        make: Callable[[int], str], at_limit: int, key: str, why: str) -> None:
    """Without aliases, a config past a documented limit is refused with one error that names
    the limit, the key (where one has it) and its line, and says what to do; at the limit it
    is taken as before (or refused for something else)."""
    over = make(at_limit + 1)
    [error] = _errors(over)
    assert error.startswith(f"vaultmail.yml: {key + ': ' if key else ''}{why}"), error[:300]
    assert ", column " in error[-20:] and ": " in error, error[-200:]
    try:
        parse_office(make(at_limit), "vaultmail.yml", repository=True)
    except OfficeConfigError as exc:
        assert not any("more than" in e for e in exc.errors), exc.errors[:3]


async def test_a_pushed_alias_bomb_is_refused_in_the_issue_at_its_line(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """Pushed to the org's `.github`, the same file is refused as any invalid config is: the
    `vaultmail.yml was refused` issue names the limit and the line; the last valid config
    stays in force."""
    text = _alias_bomb(200)
    embedded.forge.put_file("acme/.github", "vaultmail.yml", text, pusher="admin")
    await embedded.settle()
    [issue] = await person("admin").issues("acme/.github")
    assert issue["title"] == "vaultmail.yml was refused"
    assert "holds more than 250,000 values once its aliases are expanded" in issue["body"], \
        issue["body"]
    sent = await tools("agent:builder")("mail_send", to="scout", subject="Still", body="works")
    assert sent["mail"]["to_principal"] == "agent:scout"


async def test_a_config_too_big_for_githubs_contents_api_is_refused_by_its_size(
        embedded: Embedded, person: Any) -> None:
    """GitHub's contents API gives a file over 1 MB no bytes (`encoding: none`) and says its
    `size`: one over the 2 MiB limit is refused as too big, naming the limit (not as an
    encoding this app cannot read), before anything is decoded. (On Gitea, which sends the
    bytes however many: tests/gitea/test_config_size.py.)"""
    line = "# " + "x" * 1021 + "\n"
    text = line * (3 * MIB // len(line))
    embedded.forge.put_file("acme/.github", "vaultmail.yml", text, pusher="admin")
    await embedded.settle()
    [issue] = await person("admin").issues("acme/.github")
    assert issue["title"] == "vaultmail.yml was refused"
    assert "more than 2,097,152 bytes (2 MiB), the most a config may be" in issue["body"], \
        issue["body"]
