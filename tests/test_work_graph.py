"""Issue 25, the app: goals, outcomes, plans and evidence as GitHub models work, acted out over
real HTTP on the local forge. An item's kind comes from its issue type (Goal, Outcome, Plan,
Evidence) and, failing that, from its label; its parent from its sub-issue parent and, failing
that, from `Part of #N`. A tree built with types and sub-issues alone (no labels, no `Part of`
text) gives the same tree, decisions and inbox as the label-and-text tree."""

from __future__ import annotations

from collections.abc import AsyncIterator
from importlib import resources
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.app.embedded import Embedded, start_embedded
from bot.items.model import item_from_issue, parent_of
from bot.office.config import Office, load_office, parse_office
from bot.store import comments as db
from bot.store import mails
from tests.items_support import MARCO, SCOUT, TOKEN_TTL, VAULT, make_item, where
from tests.support import Actor, gitea_api

GOALS = "acme/critic-vault"  # goals in another repository of the org than the outcome
PRODUCT = "acme/product"
TYPES = ("Goal", "Outcome", "Plan", "Evidence")


async def make_types(admin: Actor, names: tuple[str, ...] = TYPES) -> None:
    for name in names:
        await admin.call("POST", "/orgs/acme/issue-types", {"name": name, "is_enabled": True},
                         expect=200)


async def typed_item(embedded: Embedded, who: Actor, kind: str, title: str, *,
                     repo: str = VAULT, body: str = "",
                     assignees: list[str] | None = None) -> tuple[str, int]:
    """An issue with the issue type `kind` and no label: its ref and its id."""
    issue = await who.open_issue(repo, title, body or title, type=kind.capitalize(),
                                 assignees=assignees or [])
    await embedded.settle()
    return f"{repo}#{issue['number']}", int(issue["id"])


async def link(embedded: Embedded, who: Actor, parent: str, sub_id: int, *,
               replace: bool = False) -> None:
    repo, n = where(parent)
    body: dict[str, Any] = {"sub_issue_id": sub_id}
    if replace:
        body["replace_parent"] = True
    await who.call("POST", f"/repos/{repo}/issues/{n}/sub_issues", body, expect=201)
    await embedded.settle()


async def unlink(embedded: Embedded, who: Actor, parent: str, sub_id: int) -> None:
    repo, n = where(parent)
    await who.call("DELETE", f"/repos/{repo}/issues/{n}/sub_issue", {"sub_issue_id": sub_id},
                   expect=200)
    await embedded.settle()


async def native_tree(embedded: Embedded, marco: Actor) -> dict[str, str]:
    goal, _ = await typed_item(embedded, marco, "goal", "Faster sign-in", repo=GOALS)
    outcome, outcome_id = await typed_item(embedded, marco, "outcome", "Auth schema migration",
                                           assignees=["scout-bot"])
    plan, plan_id = await typed_item(embedded, marco, "plan", "Dual-read plan")
    await link(embedded, marco, goal, outcome_id)
    await link(embedded, marco, outcome, plan_id)
    return {"goal": goal, "outcome": outcome, "plan": plan}


async def text_tree(embedded: Embedded, marco: Actor) -> dict[str, str]:
    goal = await make_item(embedded, marco, "goal", "Faster sign-in", repo=GOALS)
    outcome = await make_item(embedded, marco, "outcome", "Auth schema migration",
                              body=f"Part of {goal}", assignees=["scout-bot"])
    plan = await make_item(embedded, marco, "plan", "Dual-read plan", body=f"Part of {outcome}")
    return {"goal": goal, "outcome": outcome, "plan": plan}


async def act_out(embedded: Embedded, tools: Any, refs: dict[str, str]) -> dict[str, Any]:
    """The comments seed's story on a tree: scout asks marco on the plan, marco answers; what
    the tools show then, with refs named by role so that two trees compare."""
    scout, marco = tools(SCOUT), tools(MARCO)
    asked = await scout("add_comment", **{**TOKEN_TTL, "targetType": "plan",
                                          "target": refs["plan"]})
    inbox_before = await marco("list_inbox")
    await marco("add_comment", targetType="plan", target=refs["plan"],
                parent=asked["comment"]["id"], option=1)
    await embedded.settle()
    got_outcome = await scout("get_outcome", outcome=refs["outcome"])
    got_tree = await scout("get_tree", goal=refs["goal"])
    names = {ref: role for role, ref in refs.items()}

    def name(ref: str | None) -> str | None:
        return names.get(ref, ref) if ref else None

    def node(n: dict[str, Any]) -> Any:
        return (name(n["ref"]), n["kind"], name(n["parent"]), n["claim"],
                [node(c) for c in n["children"]])

    return {
        "asked": (asked["thread"]["waitingOn"], [(r["principal"], r["way"])
                                                 for r in asked["notify"]]),
        "your_turn": [(name(v["item"]), v["header"]) for v in inbox_before["you"]["yourTurn"]],
        "outcome": (name(got_outcome["outcome"]["ref"]), got_outcome["outcome"]["claim"],
                    name(got_outcome["outcome"]["parent"])),
        "decisions": [(d["header"], d["answer"]["option"]) for d in got_outcome["decisions"]],
        "goals": [(name(g["ref"]), g["kind"]) for g in got_outcome["goals"]],
        "tree": [node(c) for c in got_tree["children"]],
        "updates": sorted((name(u["item"]), u["kind"]) for u in
                          (await marco("list_inbox"))["updates"]),
    }


# -- the tree from types and sub-issues alone ----------------------------------------------
async def test_a_tree_of_types_and_sub_issues_alone_acts_as_the_label_and_text_tree(
        embedded: Embedded, person: Any, tools: Any) -> None:
    marco = person("marco")
    await make_types(person("admin"))
    by_text = await act_out(embedded, tools, await text_tree(embedded, marco))
    native = await act_out(embedded, tools, await native_tree(embedded, marco))
    assert by_text["tree"] == [("outcome", "outcome", "goal", SCOUT, [
        ("plan", "plan", "outcome", SCOUT, [])])], "the label-and-text tree, as the app had it"
    assert by_text["decisions"] == [("Token TTL", "Keep 30 days")]
    assert by_text["goals"] == [("goal", "goal")]
    assert native == by_text


async def test_removing_or_moving_a_sub_issue_moves_the_item_and_its_decisions(
        embedded: Embedded, person: Any, tools: Any) -> None:
    marco = person("marco")
    await make_types(person("admin"))
    refs = await native_tree(embedded, marco)
    other, _ = await typed_item(embedded, marco, "outcome", "Session cleanup",
                                assignees=["scout-bot"])
    scout = tools(SCOUT)
    asked = await scout("add_comment", **{**TOKEN_TTL, "targetType": "plan",
                                          "target": refs["plan"]})
    await tools(MARCO)("add_comment", targetType="plan", target=refs["plan"],
                       parent=asked["comment"]["id"], option=2)
    assert len((await scout("get_outcome", outcome=refs["outcome"]))["decisions"]) == 1
    plan_id = int((await marco.issue(*where(refs["plan"])))["id"])
    await link(embedded, marco, other, plan_id, replace=True)  # the plan moves
    assert (await scout("get_outcome", outcome=refs["outcome"]))["decisions"] == []
    assert len((await scout("get_outcome", outcome=other))["decisions"]) == 1
    tree = await scout("get_tree", goal=refs["goal"])
    assert tree["children"][0]["children"] == []
    await unlink(embedded, marco, other, plan_id)
    item = await db.get_item(embedded.services.store, refs["plan"])
    assert item is not None and item.parent is None
    # the outcome under the goal: linked by sub-issue only, so get_outcome walks to the goal
    assert [g["ref"] for g in (await scout("get_outcome", outcome=refs["outcome"]))["goals"]] \
        == [refs["goal"]]


async def test_the_sub_issue_parent_comes_before_part_of_text_also_after_an_edit(
        embedded: Embedded, person: Any, tools: Any) -> None:
    marco = person("marco")
    await make_types(person("admin"))
    refs = await native_tree(embedded, marco)
    other = await make_item(embedded, marco, "outcome", "Session cleanup",
                            assignees=["scout-bot"])
    # a plan whose text names one outcome and whose sub-issue parent is another
    plan, plan_id = await typed_item(embedded, marco, "plan", "Cleanup plan",
                                     body=f"Part of {other}")
    await link(embedded, marco, refs["outcome"], plan_id)
    scout = tools(SCOUT)
    got = await scout("get_tree", goal=refs["goal"])
    assert sorted(c["ref"] for c in got["children"][0]["children"]) == sorted(
        [refs["plan"], plan])
    # an edit of the plan: the webhook's issue says no parent; the parent stays the native one
    repo, n = where(plan)
    await marco.call("PATCH", f"/repos/{repo}/issues/{n}", {"title": "Cleanup plan v2"},
                     expect=200)
    await embedded.settle()
    item = await db.get_item(embedded.services.store, plan)
    assert item is not None and item.parent == refs["outcome"] and item.title.endswith("v2")
    # without a sub-issue parent, `Part of` is the fallback again
    await unlink(embedded, marco, refs["outcome"], plan_id)
    item = await db.get_item(embedded.services.store, plan)
    assert item is not None and item.parent == other


async def test_a_label_and_text_item_costs_no_read_of_its_issue_for_its_parent(
        embedded: Embedded, person: Any) -> None:
    """The index answers while the `Part of` text agrees with it: opening, commenting on and
    retitling such an item never reads the issue again for its sub-issue parent."""
    marco = person("marco")
    goal = await make_item(embedded, marco, "goal", "Faster sign-in")
    embedded.forge.requests.clear()
    outcome = await make_item(embedded, marco, "outcome", "Auth", body=f"Part of {goal}")
    repo, n = where(outcome)
    await marco.comment(repo, n, "Starting on this")
    await marco.call("PATCH", f"/repos/{repo}/issues/{n}", {"title": "Auth v2"}, expect=200)
    await embedded.settle()
    read = [r.path for r in embedded.forge.requests
            if r.auth == "installation" and r.route == "GET /repos/{owner}/{repo}/issues/"
            "{issue_number}"]
    assert read == []
    item = await db.get_item(embedded.services.store, outcome)
    assert item is not None and item.parent == goal and item.title == "Auth v2"


async def test_an_issue_of_an_item_type_in_a_vault_is_an_item_not_mail(
        embedded: Embedded, person: Any) -> None:
    marco = person("marco")
    await make_types(person("admin"))
    ref, _ = await typed_item(embedded, marco, "plan", "Dual-read plan")
    got = await marco.issue(*where(ref))
    assert [lb["name"] for lb in got["labels"]] == [] and got["state"] == "open"
    assert await mails.mail_at(embedded.services.store, *where(ref)) is None
    item = await db.get_item(embedded.services.store, ref)
    assert item is not None and item.kind == "plan"


async def test_an_issue_type_makes_an_item_and_changing_it_changes_the_kind(
        embedded: Embedded, person: Any, tools: Any) -> None:
    marco, admin = person("marco"), person("admin")
    await make_types(admin, ("Bug", *TYPES))
    # no type, no label (in a repository that is no vault: there it would be mail)
    await admin.call("POST", "/orgs/acme/repos", {"name": "product"}, expect=201)
    await embedded.settle()
    embedded.forge.set_permission(PRODUCT, "marco", "write")
    issue = await marco.open_issue(PRODUCT, "Sessions survive", "text")
    ref = f"{PRODUCT}#{issue['number']}"
    await embedded.settle()
    assert await db.get_item(embedded.services.store, ref) is None
    await marco.call("PATCH", f"/repos/{PRODUCT}/issues/{issue['number']}", {"type": "Evidence"},
                     expect=200)
    await embedded.settle()
    item = await db.get_item(embedded.services.store, ref)
    assert item is not None and item.kind == "evidence"
    await marco.call("PATCH", f"/repos/{PRODUCT}/issues/{issue['number']}", {"type": "Plan"},
                     expect=200)
    await embedded.settle()
    item = await db.get_item(embedded.services.store, ref)
    assert item is not None and item.kind == "plan"
    # a type that is no item kind leaves the label to say: this one is labelled outcome
    labelled = await marco.open_issue(VAULT, "A bug", "text", type="Bug", labels=["outcome"])
    await embedded.settle()
    got = await tools(SCOUT)("get_outcome", outcome=f"{VAULT}#{labelled['number']}")
    assert got["outcome"]["kind"] == "outcome"


# -- reading kinds and parents the same way (sans I/O) -------------------------------------
def issue(labels: list[str], type_name: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"number": 3, "title": "t", "body": "", "state": "open", "user": {"login": "marco"},
            "labels": [{"name": n} for n in labels],
            "type": {"id": 1, "name": type_name} if type_name else None, **extra}


def kind(office: Office, data: dict[str, Any]) -> str | None:
    item = item_from_issue(office, "acme/x", data)
    return item.kind if item is not None else None


def test_kind_by_issue_type_first_then_label_and_an_office_mapping() -> None:
    office = load_office()
    assert kind(office, issue([], "plan")) == "plan"
    assert kind(office, issue(["goal"], "Outcome")) == "outcome", "the type says, over a label"
    assert kind(office, issue(["goal"], "Bug")) == "goal", "a type that is no kind: the label"
    assert kind(office, issue([], "Bug")) is None
    text = resources.files("bot").joinpath("example_office.yml").read_text()
    mapped = parse_office(text.replace("org: acme\n", "org: acme\nitem_types: "
                                       "{outcome: Epic, plan: Task}\n", 1), repository=False)
    assert kind(mapped, issue([], "Epic")) == "outcome"
    assert kind(mapped, issue([], "task")) == "plan"
    assert kind(mapped, issue([], "Outcome")) is None, \
        "the mapping replaces the default name of the kinds it names"
    assert kind(mapped, issue([], "Goal")) == "goal"


def test_parent_from_the_sub_issue_link_first_then_part_of() -> None:
    both = {"body": "Part of #7", "parent_issue_url": "http://f/repos/acme/b/issues/9"}
    assert parent_of("acme/a", both) == "acme/b#9"
    assert parent_of("acme/a", {"body": "Part of #7", "parent_issue_url": None}) == "acme/a#7"
    other_org = {"body": "Part of #7", "parent_issue_url": "http://f/repos/evil/b/issues/9"}
    assert parent_of("acme/a", other_org) == "acme/a#7"


# -- Gitea: no issue types, no sub-issues: labels and `Part of` say it ------------------------
@pytest.fixture
async def gitea_office(tmp_path: Path) -> AsyncIterator[Embedded]:
    """`vaultmail up --forge gitea` in-process (SQLite), on free loopback ports."""
    emb = await start_embedded(data_dir=tmp_path, port=0, forge_port=0, dialect="gitea")
    try:
        yield emb
    finally:
        await emb.stop()


async def test_on_gitea_labels_and_part_of_still_make_the_tree(
        gitea_office: Embedded, session: aiohttp.ClientSession) -> None:
    office = gitea_office
    call = gitea_api(session, office, "marco")

    ids = {}
    for kind in ("goal", "outcome"):
        ids[kind] = (await call("POST", f"/repos/{VAULT}/labels",
                                {"name": kind, "color": "#00aabb"}, 201))["id"]
    goal = await call("POST", f"/repos/{VAULT}/issues",
                      {"title": "Faster sign-in", "body": "x", "labels": [ids["goal"]]}, 201)
    outcome = await call("POST", f"/repos/{VAULT}/issues", {
        "title": "Auth schema migration", "body": f"Part of #{goal['number']}",
        "labels": [ids["outcome"]]}, 201)
    await office.settle()
    headers = {"Authorization": f"Bearer {office.api_tokens[SCOUT]}"}
    async with session.post(f"{office.app_url}/api/v1/tools/get_tree",
                            json={"goal": f"{VAULT}#{goal['number']}"},
                            headers=headers) as resp:
        tree = await resp.json()
        assert resp.status == 200, tree
    assert [c["ref"] for c in tree["children"]] == [f"{VAULT}#{outcome['number']}"]


# -- the tree read from the forge: sub-issues, then `Part of` ------------------------------
async def test_a_sub_issue_linked_or_unlinked_with_its_webhooks_lost_shows_as_the_forge_has_it(
        embedded: Embedded, person: Any, tools: Any) -> None:
    marco = person("marco")
    await make_types(person("admin"))
    refs = await native_tree(embedded, marco)
    store = embedded.services.store
    late, late_id = await typed_item(embedded, marco, "evidence", "Load test numbers")
    embedded.forge.faults.drop_webhooks(count=2)  # sub_issue_added and parent_issue_added
    await link(embedded, marco, refs["outcome"], late_id)
    known = await db.get_item(store, late)
    assert known is not None and known.parent is None, "the webhooks were lost"
    scout = tools(SCOUT)
    got = await scout("get_tree", goal=refs["goal"])
    under = [(c["ref"], c["claim"]) for c in got["children"][0]["children"]]
    assert under == [(refs["plan"], SCOUT), (late, SCOUT)], "in the forge's order"
    known = await db.get_item(store, late)
    assert known is not None and known.parent == refs["outcome"], "the index follows"
    # the plan leaves the outcome; its webhooks are lost too: the tree no longer shows it
    plan_id = int((await marco.issue(*where(refs["plan"])))["id"])
    embedded.forge.faults.drop_webhooks(count=2)
    await unlink(embedded, marco, refs["outcome"], plan_id)
    got = await scout("get_tree", goal=refs["goal"])
    assert [c["ref"] for c in got["children"][0]["children"]] == [late]
    known = await db.get_item(store, refs["plan"])
    assert known is not None and known.parent is None


async def test_get_outcome_walks_up_links_whose_webhooks_were_lost(
        embedded: Embedded, person: Any, tools: Any) -> None:
    marco = person("marco")
    await make_types(person("admin"))
    refs = await native_tree(embedded, marco)
    top, _ = await typed_item(embedded, marco, "goal", "Retention", repo=GOALS)
    goal_id = int((await marco.issue(*where(refs["goal"])))["id"])
    embedded.forge.faults.drop_webhooks(count=2)
    await link(embedded, marco, top, goal_id)
    got = await tools(SCOUT)("get_outcome", outcome=refs["outcome"])
    assert [g["ref"] for g in got["goals"]] == [refs["goal"], top]


async def test_the_tree_costs_one_sub_issues_read_a_level_and_304s_when_unchanged(
        embedded: Embedded, person: Any, tools: Any) -> None:
    marco = person("marco")
    await make_types(person("admin"))
    refs = await native_tree(embedded, marco)
    scout = tools(SCOUT)
    route = "GET /repos/{owner}/{repo}/issues/{issue_number}/sub_issues"

    def reads() -> list[tuple[str, int]]:
        return [(r.path.split("?")[0], r.status) for r in embedded.forge.requests
                if r.auth == "installation" and r.route == route]

    embedded.forge.requests.clear()
    first = await scout("get_tree", goal=refs["goal"])
    paths = sorted(p for p, _ in reads())
    assert paths == sorted(f"/repos/{repo}/issues/{n}/sub_issues"
                           for repo, n in map(where, refs.values()))
    embedded.forge.requests.clear()
    assert await scout("get_tree", goal=refs["goal"]) == first
    assert [s for _, s in reads()] == [304, 304, 304], "the ETag cache answers"
