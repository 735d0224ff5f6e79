"""Issue 25, waiting made visible where people look: an outcome whose open questions wait on
someone is shown in the forge's own view as blocked by a "Waiting on <who>" tracking issue
(`waiting: dependency` in the office config), or by the org's "Waiting on" issue field
(`waiting: field`), and stops being once they are answered. The default (`none`) writes
nothing to the forge."""

from __future__ import annotations

import asyncio
import json
from importlib import resources
from pathlib import Path
from typing import Any

from bot.app.embedded import Embedded
from bot.forge.github import GitHubForge
from bot.items.service import Comments, NewComment
from bot.office.source import CONFIG_PATH, CONFIG_REPO
from tests.items_support import MARCO, SCOUT, TOKEN_TTL, make_item, where
from tests.support import Actor
from tests.test_stalled_send import CREATE, GUARD
from tests.test_work_graph_cli import setup_types

DEPS = "POST /repos/{owner}/{repo}/issues/{issue_number}/dependencies/blocked_by"


async def waiting_by(embedded: Embedded, mode: str) -> None:
    text = resources.files("bot").joinpath("example_office.yml").read_text()
    embedded.forge.put_file(f"acme/{CONFIG_REPO}", CONFIG_PATH,
                            text.replace("org: acme\n", f"org: acme\nwaiting: {mode}\n", 1),
                            pusher="admin")
    await embedded.settle()


async def waiting_by_dependency(embedded: Embedded) -> None:
    await waiting_by(embedded, "dependency")


async def waiting_field(who: Actor, ref: str) -> Any:
    """The outcome's "Waiting on" value as the forge shows it (None: no value)."""
    repo, n = where(ref)
    issue = await who.call("GET", f"/repos/{repo}/issues/{n}", expect=200)
    return next((v["value"] for v in issue["issue_field_values"]
                 if v["issue_field_name"] == "Waiting on"), None)


async def blocked_by(who: Actor, ref: str) -> list[dict[str, Any]]:
    repo, n = where(ref)
    return list(await who.call("GET", f"/repos/{repo}/issues/{n}/dependencies/blocked_by",
                               expect=200))


async def ask(tools: Any, target: str, target_type: str = "outcome",
              **extra: Any) -> dict[str, Any]:
    got: dict[str, Any] = await tools(SCOUT)("add_comment", **{
        **TOKEN_TTL, "targetType": target_type, "target": target, **extra})
    return got


async def answer(tools: Any, target: str, asked: dict[str, Any],
                 target_type: str = "outcome") -> None:
    await tools(MARCO)("add_comment", targetType=target_type, target=target,
                       parent=asked["comment"]["id"], option=1)


async def test_an_outcome_waiting_on_a_person_is_blocked_by_their_tracker_until_answered(
        embedded: Embedded, person: Any, tools: Any) -> None:
    await waiting_by_dependency(embedded)
    marco = person("marco")
    outcome = await make_item(embedded, marco, "outcome", "Auth schema migration",
                              assignees=["scout-bot"])
    plan = await make_item(embedded, marco, "plan", "Dual-read plan", body=f"Part of {outcome}")
    on_plan = await ask(tools, plan, "plan")  # a plan's question waits for its outcome
    [tracker] = await blocked_by(marco, outcome)
    assert tracker["title"] == "Waiting on marco" and tracker["state"] == "open"
    assert "@" not in tracker["body"], "it mentions nobody: it notifies nobody"
    repo, n = where(outcome)
    got = await marco.call("GET", f"/repos/{repo}/issues/{n}", expect=200)
    assert got["issue_dependencies_summary"]["blocked_by"] == 1, "the forge shows it blocked"
    on_outcome = await ask(tools, outcome, header="Rollout day")
    assert [t["id"] for t in await blocked_by(marco, outcome)] == [tracker["id"]], \
        "one tracker a person, however many questions wait on them"
    await answer(tools, plan, on_plan, "plan")
    assert len(await blocked_by(marco, outcome)) == 1, "a question still waits on marco"
    await answer(tools, outcome, on_outcome)
    assert await blocked_by(marco, outcome) == [], "answered: blocked no more"
    still = await marco.call("GET", f"/repos/{repo}/issues/{tracker['number']}", expect=200)
    assert still["state"] == "open", "the tracker stays for the next wait"
    # another outcome that waits on marco is blocked by the same tracker
    other = await make_item(embedded, marco, "outcome", "Session cleanup")
    await ask(tools, other)
    assert [t["id"] for t in await blocked_by(marco, other)] == [tracker["id"]]
    trackers = [i for i in await marco.call("GET", f"/repos/{repo}/issues?state=all",
                                            expect=200) if i["title"].startswith("Waiting on")]
    assert len(trackers) == 1


async def test_by_default_the_forge_shows_no_waiting(
        embedded: Embedded, person: Any, tools: Any) -> None:
    marco = person("marco")
    outcome = await make_item(embedded, marco, "outcome", "Auth schema migration")
    embedded.forge.requests.clear()
    await ask(tools, outcome)
    assert await blocked_by(marco, outcome) == []
    assert [r for r in embedded.forge.requests if "dependencies" in r.route] == [
        r for r in embedded.forge.requests if r.auth != "installation"
        and "dependencies" in r.route], "the app asked nothing about dependencies"


async def test_a_tracker_the_index_lost_is_still_known_by_its_marker(
        embedded: Embedded, person: Any, tools: Any) -> None:
    await waiting_by_dependency(embedded)
    marco = person("marco")
    outcome = await make_item(embedded, marco, "outcome", "Auth schema migration")
    asked = await ask(tools, outcome)
    assert len(await blocked_by(marco, outcome)) == 1
    async with embedded.services.store.transaction() as tx:
        await tx.execute("DELETE FROM waiting_trackers")
    await answer(tools, outcome, asked)
    assert await blocked_by(marco, outcome) == []


async def test_closing_the_outcome_clears_its_waiting_and_reopening_shows_it_again(
        embedded: Embedded, person: Any, tools: Any) -> None:
    await waiting_by_dependency(embedded)
    marco = person("marco")
    outcome = await make_item(embedded, marco, "outcome", "Auth schema migration")
    await ask(tools, outcome)
    assert len(await blocked_by(marco, outcome)) == 1
    repo, n = where(outcome)
    await marco.call("PATCH", f"/repos/{repo}/issues/{n}", {"state": "closed"}, expect=200)
    await embedded.settle()
    assert await blocked_by(marco, outcome) == [], "a closed outcome waits on nobody"
    await marco.call("PATCH", f"/repos/{repo}/issues/{n}", {"state": "open"}, expect=200)
    await embedded.settle()
    assert len(await blocked_by(marco, outcome)) == 1, "the question still waits"


async def test_an_outcome_waiting_names_who_in_its_waiting_on_field_until_answered(
        embedded: Embedded, person: Any, tools: Any) -> None:
    await waiting_by(embedded, "field")
    await person("admin").call("POST", "/orgs/acme/issue-fields",
                               {"name": "Waiting on", "data_type": "text"}, expect=200)
    marco = person("marco")
    outcome = await make_item(embedded, marco, "outcome", "Auth schema migration")
    plan = await make_item(embedded, marco, "plan", "Dual-read plan", body=f"Part of {outcome}")
    on_plan = await ask(tools, plan, "plan")
    assert await waiting_field(marco, outcome) == "marco"
    assert await blocked_by(marco, outcome) == [], "a field, not a dependency"
    on_outcome = await ask(tools, outcome, header="Rollout day")
    await answer(tools, plan, on_plan, "plan")
    assert await waiting_field(marco, outcome) == "marco", "a question still waits on marco"
    repo, n = where(outcome)
    [field] = await marco.call("GET", "/orgs/acme/issue-fields", expect=200)
    await marco.call("DELETE", f"/repos/{repo}/issues/{n}/issue-field-values/{field['id']}",
                     expect=204)
    await embedded.settle()
    assert await waiting_field(marco, outcome) == "marco", "cleared by hand: set again"
    await answer(tools, outcome, on_outcome)
    assert await waiting_field(marco, outcome) is None, "answered: the field is cleared"
    trackers = [i for i in await marco.call("GET", f"/repos/{repo}/issues", expect=200)
                if i["title"].startswith("Waiting on")]
    assert trackers == [], "no tracking issue"


async def test_without_the_field_the_app_says_so_once_then_uses_it_once_made(
        embedded: Embedded, person: Any, tools: Any) -> None:
    await waiting_by(embedded, "field")
    marco = person("marco")
    outcome = await make_item(embedded, marco, "outcome", "Auth schema migration")
    await ask(tools, outcome)
    await ask(tools, outcome, header="Again")
    assert await waiting_field(marco, outcome) is None
    [refused] = await embedded.ledger_events("office.config_refused")
    [line] = refused.data["errors"]
    assert "waiting: field" in line and '"Waiting on"' in line and "setup-types" in line
    listed = await marco.call("GET", "/orgs/acme/issue-fields", expect=200)
    assert listed == [], "the App may not create an org's issue field"
    await person("admin").call("POST", "/orgs/acme/issue-fields",
                               {"name": "Waiting on", "data_type": "text"}, expect=200)
    await ask(tools, outcome, header="Once more")
    assert await waiting_field(marco, outcome) == "marco"
    assert len(await embedded.ledger_events("office.config_refused")) == 1


async def test_setup_types_makes_the_waiting_on_field_for_an_office_that_waits_by_field(
        embedded: Embedded, person: Any, tmp_path: Path) -> None:
    office = tmp_path / "vaultmail.yml"
    text = resources.files("bot").joinpath("example_office.yml").read_text()
    office.write_text(text.replace("org: acme\n", "org: acme\nwaiting: field\n", 1))
    code, out, err = await setup_types(embedded, "admin", tmp_path, "--office", str(office),
                                       "--json")
    assert code == 0, err
    assert json.loads(out)["result"]["fields"] == [{"field": "Waiting on", "done": "created"}]
    [made] = await person("admin").call("GET", "/orgs/acme/issue-fields", expect=200)
    assert (made["name"], made["data_type"]) == ("Waiting on", "text")
    code, out, _ = await setup_types(embedded, "admin", tmp_path, "--office", str(office))
    assert code == 0 and "Waiting on: exists" in out


async def test_a_waiting_blocker_a_person_removes_comes_back_while_the_question_waits(
        embedded: Embedded, person: Any, tools: Any) -> None:
    await waiting_by_dependency(embedded)
    marco = person("marco")
    outcome = await make_item(embedded, marco, "outcome", "Auth schema migration")
    asked = await ask(tools, outcome)
    [tracker] = await blocked_by(marco, outcome)
    repo, n = where(outcome)
    await marco.call("DELETE", f"/repos/{repo}/issues/{n}/dependencies/blocked_by/"
                               f"{tracker['id']}", expect=200)
    await embedded.settle()
    assert [t["id"] for t in await blocked_by(marco, outcome)] == [tracker["id"]], \
        "put back: the question still waits on marco"
    # a blocker of the people's own is theirs: removing it changes nothing the app keeps
    other = await marco.open_issue(repo, "Schema review", "x")
    await marco.call("POST", f"/repos/{repo}/issues/{n}/dependencies/blocked_by",
                     {"issue_id": other["id"]}, expect=201)
    await marco.call("DELETE", f"/repos/{repo}/issues/{n}/dependencies/blocked_by/"
                               f"{other['id']}", expect=200)
    await embedded.settle()
    assert [t["id"] for t in await blocked_by(marco, outcome)] == [tracker["id"]]
    await answer(tools, outcome, asked)
    assert await blocked_by(marco, outcome) == [], "answered: the app removes it for good"


async def test_two_questions_at_once_open_one_tracker_for_the_person_they_wait_on(
        embedded: Embedded, person: Any) -> None:
    """scout asks marco on two outcomes at once, through two replicas: a's tracker create is
    held at the forge; b's question looks (no tracker yet) and opens one; a's then lands.
    marco has one open "Waiting on marco" (the later closed as its duplicate), and both
    outcomes are blocked by it."""
    await waiting_by_dependency(embedded)
    marco = person("marco")
    first = await make_item(embedded, marco, "outcome", "Auth schema migration")
    second = await make_item(embedded, marco, "outcome", "Billing export")
    repo, _ = where(first)
    services = embedded.services
    forge = services.forge_for_org("acme")
    assert isinstance(forge, GitHubForge)

    office = await services.offices.get(forge, "acme")  # (the config pushed: it waits so)
    assert office is not None and office.waiting == "dependency"

    async def ask_on(target: str, its_forge: GitHubForge) -> None:
        comments = Comments(services, its_forge, office)
        item = await comments.load_item(*where(target))
        await comments.add(SCOUT, item, NewComment(body="Keep old sessions?",
                                                   to=["marco@acme.com"], needs_reply=True))

    held = embedded.forge.faults.hold(CREATE, count=1, repo=repo)
    asking = asyncio.create_task(ask_on(first, forge))
    arrived = asyncio.create_task(held.arrived.wait())
    await asyncio.wait([arrived, asking], timeout=GUARD, return_when=asyncio.FIRST_COMPLETED)
    assert arrived.done(), asking  # a's tracker is at the forge
    # (b: another replica, its own forge client)
    await asyncio.wait_for(ask_on(second, GitHubForge(forge.client, forge.installation_id)),
                           GUARD)
    held.release()  # a's tracker lands now, after b's
    await asyncio.wait_for(asking, GUARD)
    await embedded.settle()
    issues = await marco.call("GET", f"/repos/{repo}/issues?state=all&per_page=100",
                              expect=200)
    trackers = [i for i in issues if i["title"] == "Waiting on marco"]
    [kept] = [t for t in trackers if t["state"] == "open"]
    assert [t["id"] for t in await blocked_by(marco, first)] == [kept["id"]]
    assert [t["id"] for t in await blocked_by(marco, second)] == [kept["id"]]
