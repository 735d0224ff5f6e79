"""Persistence row by row (localforge/persist.py): a restart restores exactly the state a
forge stopped with, an older single-snapshot file still loads, and a save writes what the
write changed, not the whole state."""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pydantic import BaseModel

from localforge import LocalForge
from localforge.persist import FILENAME, Snapshotter
from localforge.state import Comment, Delivery, Repo, State, Tracked, WebSession, WebState

from .conftest import Hooks, Keys, World, make_world


@pytest.fixture
async def persisted(tmp_path: Path, hooks: Hooks, keys: Keys) -> AsyncIterator[World]:
    forge = LocalForge(data_dir=tmp_path)
    await forge.start("127.0.0.1", 0)
    async with aiohttp.ClientSession() as session:
        yield await make_world(forge, hooks, keys, session)
    await forge.stop()


async def _restarted(data_dir: Path) -> LocalForge:
    again = LocalForge(data_dir=data_dir)
    await again.start("127.0.0.1", 0)
    return again


def _on_file(data_dir: Path) -> State:
    """The state as a fresh open of the file reads it."""
    snap = Snapshotter(data_dir)
    try:
        loaded = snap.load()
    finally:
        snap.close()
    assert loaded is not None
    return loaded[0]


async def test_a_restart_restores_every_kind_of_write(tmp_path: Path, persisted: World) -> None:
    w, forge = persisted, persisted.forge
    ok = {200, 201, 204}
    # through the API, as the app and people write
    s, _, issue = await w.call("POST", "/repos/acme/vault/issues", "marco",
                               {"title": "kept", "body": "b", "labels": ["mail:new"],
                                "assignees": ["marco"]})
    assert s == 201
    n = issue["number"]
    ids = []
    for text in ("one", "two", "three"):
        s, _, c = await w.call("POST", f"/repos/acme/vault/issues/{n}/comments", "marco",
                               {"body": text})
        assert s == 201
        ids.append(c["id"])
    calls: list[tuple[str, str, Any]] = [
        ("PATCH", f"/repos/acme/vault/issues/comments/{ids[0]}", {"body": "one, edited"}),
        ("DELETE", f"/repos/acme/vault/issues/comments/{ids[1]}", None),
        ("POST", f"/repos/acme/vault/issues/comments/{ids[2]}/reactions", {"content": "+1"}),
        ("POST", f"/repos/acme/vault/issues/{n}/reactions", {"content": "eyes"}),
        ("POST", f"/repos/acme/vault/issues/{n}/labels", {"labels": ["q:open", "x"]}),
        ("DELETE", f"/repos/acme/vault/issues/{n}/labels/x", None),
        ("PATCH", f"/repos/acme/vault/issues/{n}", {"title": "renamed", "state": "closed"}),
        ("PATCH", f"/repos/acme/vault/issues/{n}", {"state": "open"}),
        ("POST", "/repos/acme/vault/labels", {"name": "later", "color": "00ff00"}),
    ]
    for method, path, body in calls:
        s, _, reply = await w.call(method, path, "admin", body)
        assert s in ok, (method, path, s, reply)
    await w.installation_token()
    await w.idle()  # deliveries recorded, then their results
    # through the seeding helpers and straight into the state, as tests and the CLI do
    forge.add_org_member("acme", "olga", role="admin")
    forge.remove_org_member("acme", "rita")
    forge.add_team("acme", "crew", ["marco", "tina"])
    forge.set_team_permission("acme", "crew", "acme/vault", "maintain")
    forge.add_repo("acme", "gone")
    forge.add_repo("acme", "notes")
    forge.put_file("acme/notes", "docs/a.md", "# a")
    forge.set_permission("acme/notes", "tina", "write")
    forge.remove_permission("acme/vault", "tina")
    forge.user_password("marco")
    forge.create_installation_token(w.installation_id, ttl=60)  # saved by the next write
    forge.set_callback_urls(w.app_id, ["http://127.0.0.1:1/cb"])
    st = forge.state
    st.web.sessions["s1"] = WebSession(id="s1", login="marco", created_at=1.0, expires_at=9.0)
    st.web.authorizations.setdefault("marco", []).append(w.app_id)
    gone = st.repo("acme", "gone")
    assert gone is not None
    del st.repos[gone.id]
    vault = st.repo("acme", "vault")
    assert vault is not None
    before = vault.model_copy(deep=True)  # a lost write puts a repo's issues back wholesale
    vault.issues, vault.comments = before.issues, before.comments
    vault.issues[n].events[-1].label = {"name": "edited in place", "color": "fff"}
    vault.issues[n].assignees.insert(0, "tina")
    st.teams[0].members.remove("tina")
    st.ids["comment"] += 5
    forge.clock.advance(123.5)
    forge.save()
    expected, offset = st.model_dump_json(), forge.clock.offset
    assert _on_file(tmp_path).model_dump_json() == expected  # order included
    await forge.stop()

    again = await _restarted(tmp_path)
    try:
        assert again.state.model_dump_json() == expected
        assert again.clock.offset == offset
        # and it continues: the next number and ids follow on, old tokens still sign in
        persisted.forge = again
        s, _, nxt = await w.call("POST", "/repos/acme/vault/issues", "marco", {"title": "next"})
        assert s == 201 and nxt["number"] == n + 1
        s, _, c = await w.call("POST", f"/repos/acme/vault/issues/{n}/comments", "marco",
                               {"body": "after"})
        assert s == 201 and c["id"] == max(ids) + 6
        await again.webhooks_idle()
        again.save()
        assert _on_file(tmp_path).model_dump_json() == again.state.model_dump_json()
    finally:
        await again.stop()
        persisted.forge = forge


async def test_an_older_single_snapshot_file_is_migrated(tmp_path: Path,
                                                         persisted: World) -> None:
    forge = persisted.forge
    s, _, _ = await persisted.call("POST", "/repos/acme/vault/issues", "marco",
                                   {"title": "from an older release"})
    assert s == 201
    await persisted.idle()
    old_state, offset = forge.state.model_dump_json(), 42.5
    old_dir = tmp_path / "old"
    old_dir.mkdir(mode=0o700)
    path = old_dir / FILENAME
    db = sqlite3.connect(path)  # what the previous release wrote
    db.execute("CREATE TABLE snapshot (id INTEGER PRIMARY KEY CHECK (id = 1),"
               " clock_offset REAL NOT NULL, state TEXT NOT NULL)")
    db.execute("INSERT INTO snapshot VALUES (1, ?, ?)", (offset, old_state))
    db.commit()
    db.close()
    os.chmod(path, 0o600)

    again = await _restarted(old_dir)
    try:
        assert again.state.model_dump_json() == old_state
        assert again.clock.offset == offset
        db = sqlite3.connect(path)
        try:
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
            assert "snapshot" not in tables and "rows" in tables
        finally:
            db.close()
        again.add_user("newcomer")
        expected = again.state.model_dump_json()
    finally:
        await again.stop()
    assert _on_file(old_dir).model_dump_json() == expected
    for name in os.listdir(old_dir):
        assert stat.S_IMODE(os.stat(old_dir / name).st_mode) == 0o600, name
    assert stat.S_IMODE(os.stat(old_dir).st_mode) == 0o700


def _seed_comments(forge: LocalForge, repo: Repo, count: int) -> None:
    """`count` comments spread over issues of their own, each with its delivery, as a busy
    office leaves them (written straight into the state: the API would take minutes)."""
    st, now = forge.state, forge.clock.now()
    template = next(iter(st.deliveries.values()))
    for i in range(count):
        number = 1000 + i // 50
        issue = repo.issues.get(number)
        if issue is None:
            source = next(iter(repo.issues.values()))
            issue = source.model_copy(deep=True, update={
                "id": st.next_id("issue"), "number": number, "comment_ids": []})
            repo.issues[number] = issue
        c = Comment(id=st.next_id("comment"), issue_number=number, body=f"comment {i} " * 8,
                    user="marco", created_at=now, updated_at=now)
        repo.comments[c.id] = c
        issue.comment_ids.append(c.id)
        d = template.model_copy(deep=True, update={"id": st.next_id("delivery")})
        st.deliveries[d.id] = d
    forge.save()


async def test_a_save_writes_what_the_write_changed_not_the_whole_state(
        persisted: World) -> None:
    """Counted, not timed: the bytes SQLite appends to its log for one comment (its save
    and its delivery's) are the same with 1 comment in the forge and with 2,001."""
    w, forge = persisted, persisted.forge
    snap = forge._snap
    assert snap is not None
    snap._db.execute("PRAGMA wal_autocheckpoint=0")  # the log only grows: its size counts
    wal = Path(str(snap.path) + "-wal")
    repo = forge.state.repo("acme", "vault")
    assert repo is not None

    async def one_comment() -> tuple[int, int]:
        s, _, issue = await w.call("POST", "/repos/acme/vault/issues", "marco", {"title": "t"})
        assert s == 201
        await w.idle()
        size = wal.stat().st_size
        s, _, _ = await w.call("POST", f"/repos/acme/vault/issues/{issue['number']}/comments",
                               "marco", {"body": "measured"})
        assert s == 201
        rows = snap.last.rows if hasattr(snap, "last") else -1  # rows of the request's save
        await w.idle()
        return wal.stat().st_size - size, rows

    small, small_rows = await one_comment()
    _seed_comments(forge, repo, 2000)
    assert len(repo.comments) == 2001 and len(forge.state.deliveries) > 2000
    large, large_rows = await one_comment()
    state_bytes = len(forge.state.model_dump_json())
    assert state_bytes > 2_000_000  # what the old snapshot rewrote after every write
    assert large <= 2 * small, (small, large, state_bytes)  # measured: 61,800 and 82,400
    assert large < state_bytes // 20
    assert large_rows == small_rows <= 8


async def test_a_comment_on_a_long_thread_rewrites_that_thread_only(
        persisted: World) -> None:
    """The one row that grows with history: an issue's own (its comment ids and events)."""
    w, forge = persisted, persisted.forge
    snap = forge._snap
    assert snap is not None
    s, _, issue = await w.call("POST", "/repos/acme/vault/issues", "marco", {"title": "long"})
    assert s == 201
    repo = forge.state.repo("acme", "vault")
    assert repo is not None
    thread = repo.issues[issue["number"]]
    now = forge.clock.now()
    for i in range(2000):
        c = Comment(id=forge.state.next_id("comment"), issue_number=thread.number,
                    body=f"c{i}", user="marco", created_at=now, updated_at=now)
        repo.comments[c.id] = c
        thread.comment_ids.append(c.id)
    forge.save()
    s, _, _ = await w.call("POST", f"/repos/acme/vault/issues/{thread.number}/comments",
                           "marco", {"body": "one more"})
    assert s == 201
    assert snap.last.bytes < len(thread.model_dump_json()) + 20_000


def _models(tp: Any, seen: set[type]) -> None:
    for arg in getattr(tp, "__args__", ()):
        _models(arg, seen)
    if isinstance(tp, type) and issubclass(tp, BaseModel) and tp not in seen:
        seen.add(tp)
        for info in tp.model_fields.values():
            _models(info.annotation, seen)


def test_every_model_in_the_state_reports_its_writes() -> None:
    """A model in the state that is not `Tracked` would keep an assignment from the file."""
    seen: set[type] = set()
    _models(State, seen)
    assert {Repo, Comment, Delivery, WebState, WebSession} <= seen
    assert [m.__name__ for m in seen if not issubclass(m, Tracked)] == []


async def test_without_a_data_dir_nothing_is_tracked() -> None:
    forge = LocalForge()
    forge.add_user("admin")
    assert type(forge.state.accounts) is dict and type(forge.state.tokens) is dict


def test_every_way_of_writing_a_list_or_dict_is_saved_in_order(tmp_path: Path) -> None:
    forge = LocalForge(data_dir=tmp_path)
    forge.add_user("admin")
    forge.add_org("acme", owner="admin")
    for login in ("b", "c", "d"):
        forge.add_org_member("acme", login)
    forge.add_repo("acme", "vault")
    st = forge.state
    org, repo = st.orgs["acme"], st.repo("acme", "vault")
    assert repo is not None
    steps = [
        lambda: org.members.sort(reverse=True),
        lambda: org.members.__setitem__(slice(0, 1), ["z", "y"]),
        lambda: org.members.pop(),
        lambda: org.members.reverse(),
        lambda: org.owners.extend(["b"]),
        lambda: org.owners.__iadd__(["c"]),
        lambda: org.owners.remove("b"),
        lambda: repo.collaborators.update({"b": "read", "c": "write"}),
        lambda: repo.collaborators.pop("b"),
        lambda: repo.collaborators.__ior__({"d": "admin"}),
        lambda: repo.files.setdefault("a.md", "a"),
        lambda: repo.files.update({"b.md": "b", "c.md": "c"}),
        lambda: repo.files.pop("a.md"),
        lambda: repo.files.__setitem__("a.md", "again"),  # back, now last
        lambda: st.accounts.popitem(),
        lambda: st.tokens.clear(),
        lambda: st.ids.__setitem__("label", 7),
        lambda: setattr(st, "web", WebState(passwords={"x": "y"})),
        lambda: st.web.passwords.setdefault("w", "v"),
        lambda: st.teams.clear(),
    ]
    for step in steps:
        step()
        forge.save()
        assert _on_file(tmp_path).model_dump_json() == st.model_dump_json()
    assert list(repo.files) == ["b.md", "c.md", "a.md"]
    assert list(_on_file(tmp_path).repos[repo.id].files) == ["b.md", "c.md", "a.md"]
