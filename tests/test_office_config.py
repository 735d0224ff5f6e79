"""The office config lives in the org's .github repo; a push reloads it, a bad one is refused."""

from __future__ import annotations

import json
from typing import Any

from bot.app.embedded import Embedded
from bot.store import ledger


async def test_a_valid_push_takes_effect_at_once(embedded: Embedded, tools: Any) -> None:
    builder = tools("agent:builder")
    await builder("mail_send", to="scout", subject="Before", body="allowed")
    text = _example()
    text = text.replace("      mail.send: [scout]", "      mail.send: []")
    embedded.forge.put_file("acme/.github", "vaultmail.yml", text, pusher="admin")
    await embedded.settle()
    status, body = await builder.raw("mail_send", {"to": "scout", "subject": "After", "body": "x"})
    assert status == 403 and "capabilities.mail.send" in body["error"]["message"]


async def test_an_invalid_push_is_refused_on_the_forge_and_the_old_config_stays(
        embedded: Embedded, tools: Any, person: Any) -> None:
    broken = _example().replace("slug: scout", "slug: Scout!").replace(
        "org: acme", "org: acme\nflavour: vanilla")
    embedded.forge.put_file("acme/.github", "vaultmail.yml", broken, pusher="admin")
    await embedded.settle()
    [issue] = await person("admin").issues("acme/.github")
    assert issue["title"] == "vaultmail.yml was refused" and "@admin" in issue["body"]
    assert "agents[0].slug" in issue["body"] and "flavour" in issue["body"]
    [refused] = await embedded.ledger_events("office.config_refused")
    assert len(refused.data["errors"]) == 2
    sent = await tools("agent:builder")("mail_send", to="scout", subject="Still", body="works")
    assert sent["mail"]["to_principal"] == "agent:scout"


async def test_a_push_with_thousands_of_errors_is_refused_in_an_issue_github_takes(
        embedded: Embedded, person: Any) -> None:
    """A vaultmail.yml with an error on each of thousands of lines (logins of thousands of
    characters, which the errors quote): the refusal issue listed every one, 1.4 MB that
    GitHub refuses (an issue body is at most 65,536 characters), so no issue was opened and
    the delivery failed at each retry. It lists the first 50, each cut, and says how many
    more. (The file stays under the 1 MB GitHub's contents API answers in JSON.)"""
    long = "k" * 2400
    bad = "org: acme\nhumans:\n" + "".join(
        f"  - {{email: bad{i}, login: 'x y{i}{long}', nope{i}: 1}}\n" for i in range(400))
    embedded.forge.put_file("acme/.github", "vaultmail.yml", bad, pusher="admin")
    await embedded.settle()
    [issue] = await person("admin").issues("acme/.github")
    assert len(issue["body"]) < 40_000 and "1150 more" in issue["body"], issue["body"][-300:]
    assert "humans[1].login" in issue["body"] and "(line 4, column 26)" in issue["body"]
    # the office's record of it (kept for ever, hash-chained) holds those, not 1.4 MB a push
    [entry] = await ledger.entries(embedded.services.store, org="acme",
                                   event="office.config_refused")
    assert entry.data["count"] == 1200 and len(entry.data["errors"]) == 50, entry.data["count"]
    assert len(json.dumps(entry.data)) < 40_000


def _example() -> str:
    from importlib import resources

    return resources.files("bot").joinpath("example_office.yml").read_text()


async def test_a_config_naming_another_org_is_refused(embedded: Embedded, person: Any) -> None:
    foreign = _example().replace("org: acme", "org: globex").replace(
        "  - slug: scout\n", "  - slug: scout\n    vault: globex/scout-vault\n")
    embedded.forge.put_file("acme/.github", "vaultmail.yml", foreign, pusher="admin")
    await embedded.settle()
    [issue] = await person("admin").issues("acme/.github")
    assert "org: is 'globex'" in issue["body"] and "outside acme" in issue["body"]
