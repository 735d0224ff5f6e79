"""Issue 25 on Gitea: the app's own mail states are an exclusive scoped label set, `mail/new`,
`mail/working`, `mail/replied`, `mail/closed`, `mail/held`, so the forge itself refuses two
states on one issue (Gitea's RemoveDuplicateExclusiveIssueLabels: adding a label of the scope
removes the others). The app's core keeps its names (`mail:new`); the Gitea edge maps them.
A vault the previous release labelled `mail:new` is renamed in place (same label ids, so every
issue keeps its state) the first time the app lists its labels; an issue carrying an
old-style label still reads as its state. People act on the forge's Gitea API with their
tokens, agents through the app's tools over HTTP."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp

from bot.app.embedded import Embedded, start_embedded
from bot.forge.gitea import GiteaClient, migrations
from labels.catalogue import MAIL_LABELS
from tests.gitea.conftest import GiteaSetup
from tests.gitea.test_mail_on_gitea import Person, tool

VAULT = "acme/scout-vault"
STATES = ("new", "working", "replied", "closed", "held")


async def _labels_by_name(person: Person, vault: str = VAULT) -> dict[str, dict[str, Any]]:
    labels = await person.call("GET", f"/repos/{vault}/labels", expect=200)
    return {str(lb["name"]): lb for lb in labels}


async def _state(s: aiohttp.ClientSession, office: Embedded, ref: str) -> str:
    status, got = await tool(s, office, "agent:scout", "mail_get", mail=ref)
    assert status == 200, got
    mail = got.get("mail", got)
    return str(mail["state"])


async def test_mail_on_gitea_carries_one_exclusive_state_label_swapped_on_each_move(
        office: Embedded) -> None:
    async with aiohttp.ClientSession() as s:
        marco = Person(s, office, "marco")
        for vault in office.office.vaults():
            labels = await _labels_by_name(marco, vault)
            for state in STATES:
                assert labels[f"mail/{state}"]["exclusive"] is True, (vault, state)
            assert not [n for n in labels if n.startswith("mail:")], "no old-style label made"
        assert "mail/new" in labels["mail/held"]["description"], "its text names them too"

        status, sent = await tool(s, office, "agent:builder", "mail_send", to="scout",
                                  subject="Spec", body="Spec v1")
        assert status == 200, sent
        n, ref = sent["mail"]["number"], f"{sent['mail']['vault']}#{sent['mail']['number']}"
        await office.settle()
        assert await marco.labels(n) == ["mail/new"]
        assert await _state(s, office, ref) == "mail:new", "the core keeps its own names"
        status, opened = await tool(s, office, "agent:scout", "mail_open", mail=ref)
        assert status == 200, opened
        assert await marco.labels(n) == ["mail/working"]
        status, _ = await tool(s, office, "agent:scout", "mail_reply", mail=ref, body="Fine")
        assert status == 200
        await office.settle()
        assert await marco.labels(n) == ["mail/replied"]
        assert await _state(s, office, ref) == "mail:replied"
    assert not await office.services.store.dead_letters()


async def test_a_person_adding_mail_closed_by_hand_drops_mail_new_and_the_app_follows(
        office: Embedded) -> None:
    """marco adds `mail/closed` (POST .../labels adds, it replaces nothing): the forge's own
    rule takes `mail/new` off, and the app reads one state, closed, and closes the issue."""
    async with aiohttp.ClientSession() as s:
        marco = Person(s, office, "marco")
        issue = await marco.call("POST", f"/repos/{VAULT}/issues",
                                 {"title": "Done already", "body": "Never mind."}, expect=201)
        n, ref = issue["number"], f"{VAULT}#{issue['number']}"
        await office.settle()
        assert await marco.labels(n) == ["mail/new"]
        closed = (await _labels_by_name(marco))["mail/closed"]["id"]
        got = await marco.call("POST", f"/repos/{VAULT}/issues/{n}/labels",
                               {"labels": [closed]}, expect=200)
        assert [lb["name"] for lb in got] == ["mail/closed"], "the forge kept one of the scope"
        await office.settle()
        assert await marco.labels(n) == ["mail/closed"]
        assert (await marco.issue(n))["state"] == "closed", "the app closed it, as /close does"
        assert await _state(s, office, ref) == "mail:closed"
        assert [e.subject for e in await office.ledger_events("mail.closed")] == [ref]
        assert not any("undone" in c["body"] for c in await marco.comments(n))
    assert not await office.services.store.dead_letters()


async def test_an_old_style_label_still_reads_as_its_state_and_a_write_replaces_it(
        office: Embedded) -> None:
    """A replica of the previous release, during a rolling deploy, makes `mail:working` again
    and puts it on a mail: the app reads it as mail:working, and its next write leaves one
    label, `mail/replied`. The migration leaves that label alone (its new name is taken)."""
    async with aiohttp.ClientSession() as s:
        marco, scout = Person(s, office, "marco"), Person(s, office, "scout-bot")
        status, sent = await tool(s, office, "agent:builder", "mail_send", to="scout",
                                  subject="Old label", body="x")
        assert status == 200, sent
        n, ref = sent["mail"]["number"], f"{VAULT}#{sent['mail']['number']}"
        await office.settle()
        old = await scout.call("POST", f"/repos/{VAULT}/labels",
                               {"name": "mail:working", "color": "#fbca04"}, expect=201)
        await scout.call("PUT", f"/repos/{VAULT}/issues/{n}/labels",
                         {"labels": [old["id"]]}, expect=200)
        await office.settle()
        assert await marco.labels(n) == ["mail:working"], "accepted as it is, not undone"
        assert await _state(s, office, ref) == "mail:working"
        status, _ = await tool(s, office, "agent:scout", "mail_reply", mail=ref, body="Done")
        assert status == 200
        await office.settle()
        assert await marco.labels(n) == ["mail/replied"]
        assert "mail:working" in await _labels_by_name(marco), "a label in use is not renamed"
    assert not await office.services.store.dead_letters()


async def test_a_vault_with_old_labels_is_migrated_in_place_and_its_mail_keeps_working(
        tmp_path: Path) -> None:
    """The previous release's vault: `mail:new`…, not exclusive, on its issues. The app starts
    again on it (the forge kept, as `vaultmail up` keeps it) and renames each label by id; the
    issues keep their labels, now `mail/…`, and the mail goes on. A second start renames
    nothing."""
    first = await start_embedded(data_dir=tmp_path, persist_forge=True, port=0, forge_port=0,
                                 dialect="gitea")
    app_port = int(first.app_url.rsplit(":", 1)[1])
    try:
        async with aiohttp.ClientSession() as s:
            marco = Person(s, first, "marco")
            issue = await marco.call("POST", f"/repos/{VAULT}/issues",
                                     {"title": "Before the upgrade", "body": "x"}, expect=201)
            n = issue["number"]
            await first.settle()
            assert await marco.labels(n) == ["mail/new"]
            ids: dict[str, int] = {}
            for name, label in (await _labels_by_name(marco)).items():
                if name.startswith("mail/"):  # as the previous release named them
                    old = name.replace("/", ":")
                    await marco.call("PATCH", f"/repos/{VAULT}/labels/{label['id']}",
                                     {"name": old, "exclusive": False}, expect=200)
                    ids[old] = int(label["id"])
            assert await marco.labels(n) == ["mail:new"]
    finally:
        await first.stop()

    again = await start_embedded(data_dir=tmp_path, persist_forge=True, port=app_port,
                                 forge_port=0, dialect="gitea")
    try:
        async with aiohttp.ClientSession() as s:
            marco, scout = Person(s, again, "marco"), Person(s, again, "scout-bot")
            labels = await _labels_by_name(marco)
            for old, label_id in ids.items():
                new = old.replace(":", "/")
                assert labels[new]["id"] == label_id and labels[new]["exclusive"] is True, new
                assert old not in labels
            assert await marco.labels(n) == ["mail/new"], "the issue kept its label"
            assert await _state(s, again, f"{VAULT}#{n}") == "mail:new"
            await scout.comment(n, "/working")
            await again.settle()
            assert await marco.labels(n) == ["mail/working"]
            await scout.comment(n, "On it: here is the answer.")
            await again.settle()
            assert await marco.labels(n) == ["mail/replied"]
            assert await _state(s, again, f"{VAULT}#{n}") == "mail:replied"
            # renamed once, one PATCH a label, though the labels were listed again since
            renames = [r for r in again.forge.requests.records if r.method == "PATCH"
                       and r.route.endswith("/labels/{id}") and r.login == "vaultmail"]
            assert sorted(r.path.rsplit("/", 1)[1] for r in renames) == sorted(
                str(i) for i in ids.values())
        assert not await again.services.store.dead_letters()
    finally:
        await again.stop()


async def test_two_replicas_migrating_one_vault_at_once_rename_each_label_once_in_place(
        gitea: GiteaSetup, session: aiohttp.ClientSession) -> None:
    """Two replicas start together on a vault of the previous release: both list its labels,
    both rename; each rename sets the same absolute name on the same id, so the vault ends
    with the five labels, no copy, and the issue's label where it was."""
    g, s, vault = gitea, session, f"/repos/{VAULT}"
    old: dict[str, int] = {}
    for label in MAIL_LABELS:
        _, made, _ = await g.call(s, "vaultmail", "POST", f"{vault}/labels",
                                  {"name": label.name, "color": "#" + label.color}, expect=201)
        old[label.name] = int(made["id"])
    _, issue, _ = await g.call(s, "vaultmail", "POST", f"{vault}/issues",
                               {"title": "m", "labels": [old["mail:working"]]}, expect=201)
    replicas = [GiteaClient(g.bot_token, s, g.forge.url, "vaultmail").installation()
                for _ in range(2)]
    await asyncio.gather(*(r.ensure_labels(VAULT, MAIL_LABELS) for r in replicas))
    _, labels, _ = await g.call(s, "marco", "GET", f"{vault}/labels", expect=200)
    assert sorted((lb["name"], lb["id"], lb["exclusive"]) for lb in labels) == sorted(
        (name.replace(":", "/"), i, True) for name, i in old.items())
    _, got, _ = await g.call(s, "marco", "GET", f"{vault}/issues/{issue['number']}",
                             expect=200)
    assert [lb["name"] for lb in got["labels"]] == ["mail/working"]
    read = await replicas[1].get_issue(VAULT, issue["number"])
    assert [lb["name"] for lb in read["labels"]] == ["mail:working"], "the app's name, read"
    # a state written by either replica swaps within the scope
    await replicas[0].add_labels(VAULT, issue["number"], ["mail:replied"])
    read = await replicas[1].get_issue(VAULT, issue["number"])
    assert [lb["name"] for lb in read["labels"]] == ["mail:replied"]
    assert await replicas[1].remove_label(VAULT, issue["number"], "mail:replied")
    assert (await replicas[0].get_issue(VAULT, issue["number"]))["labels"] == []


def test_only_the_apps_own_spelling_is_migrated_one_label_a_state() -> None:
    """A person's `MAIL:NEW` beside the app's `mail:new` keeps its name (it is not made a
    second, exclusive `mail/new`); two labels of one spelling: the oldest is renamed."""
    labels: list[dict[str, Any]] = [{"id": 7, "name": "MAIL:NEW"}, {"id": 3, "name": "mail:new"},
                                    {"id": 9, "name": "mail:new"}, {"id": 4, "name": "bug"}]
    assert [(lb["id"], name) for lb, name in migrations(labels)] == [(3, "mail/new")]
    # the new name taken already: nothing renamed
    assert migrations([{"id": 1, "name": "mail:closed"}, {"id": 2, "name": "mail/closed"}]) == []
