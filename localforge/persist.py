"""Persistence: the state in a SQLite file, row by row, so a forge restarted on the same
data_dir continues where it stopped, and a save writes only the rows that changed since the
last one (its cost follows the write, not the size of the state).

Rows: `rows (coll, key, seq, value)`. Each entry of the state's collections is a row: an
account, a repository's own fields, each of its issues, comments and files, a token, a
delivery, an id counter... (`_SCHEMA` names the collections; `seq` keeps each collection's
order). What lies outside a collection (State's teams) is its owner's own row, coll `@`.
Anything a later field adds lands in its owner's row: persisted, only less finely.

Tracking: with a data_dir, the state's lists and dicts are swapped for `TList`, `TDict` and
`_Coll`, which report their writes, and its models (`state.Tracked`) report assignments; each
reports to the rows it lies in. A save writes those rows in one transaction. What it cannot
see: a list or dict taken out of a model *before* the model entered the state and changed
after (the model holds a tracked copy by then); the forge's code writes through the models.

An older data_dir (one JSON snapshot of the whole state, table `snapshot`) is migrated on
first open.

The state holds every token, password and OAuth client secret: the directory is its owner's
alone (0700) and the file 0600, made so before SQLite writes a byte (its -wal and -shm take
the file's mode), whatever the umask."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import to_json

from .state import Repo, State, Tracked, WebState

FILENAME = "localforge.sqlite3"
OWN = "@"  # the coll of a node's own row; its key is the node's path ("" for the State)
_MISSING = object()
_SCALARS = (str, int, float, bool, type(None), bytes)


@dataclass(frozen=True)
class _Spec:
    """A node of the state: its collections (with the node type of their values, if any)
    and its nested nodes. The rest of its fields are its own row."""

    colls: dict[str, type[Tracked] | None]
    nodes: dict[str, type[Tracked]] = field(default_factory=dict)

    @property
    def exclude(self) -> set[str]:
        return set(self.colls) | set(self.nodes)


_SCHEMA: dict[type[BaseModel], _Spec] = {
    State: _Spec(colls={"accounts": None, "orgs": None, "repos": Repo, "apps": None,
                        "installations": None, "tokens": None, "deliveries": None,
                        "manifest_codes": None, "ids": None},
                 nodes={"web": WebState}),
    WebState: _Spec(colls={"passwords": None, "sessions": None, "authorizations": None,
                           "codes": None, "refresh_tokens": None}),
    Repo: _Spec(colls={"issues": None, "comments": None, "files": None, "blobs": None}),
}


def _skey(key: Any) -> str:
    """A collection key as its JSON object key (what `model_dump_json` writes)."""
    return key if isinstance(key, str) else json.dumps(key)


def _join(path: str, name: str) -> str:
    return f"{path}/{name}" if path else name


# -- rows a change reports to ----------------------------------------------------------------
class _Entry:
    """The row of entry `key` of a collection."""

    __slots__ = ("coll", "key")

    def __init__(self, coll: _Coll, key: Any) -> None:
        self.coll, self.key = coll, key

    def touch(self) -> None:
        self.coll.touch(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Entry) and other.coll is self.coll and other.key == self.key

    def __hash__(self) -> int:
        return hash((id(self.coll), self.key))


class _Own:
    """The own row of a node outside any collection (the State, its WebState)."""

    __slots__ = ("alive", "node", "path", "store")

    def __init__(self, store: Snapshotter, node: Tracked, path: str) -> None:
        self.store, self.node, self.path, self.alive = store, node, path, True

    def touch(self) -> None:
        if self.alive:
            self.store._dirty_own[self.path] = self


_Ref = _Entry | _Own


class _Binding:
    """Where a node lies: its path, its own row, its collections and nested nodes."""

    __slots__ = ("alive", "children", "colls", "own", "path", "spec", "store")

    def __init__(self, store: Snapshotter, spec: _Spec, path: str, own: _Ref) -> None:
        self.store, self.spec, self.path, self.own = store, spec, path, own
        self.alive = True
        self.colls: dict[str, _Coll] = {}
        self.children: dict[str, Tracked] = {}


class _Hook:
    """A model's tie to the rows it lies in (`Tracked._lf_hook`)."""

    __slots__ = ("node", "refs")

    def __init__(self) -> None:
        self.refs: tuple[_Ref, ...] = ()
        self.node: _Binding | None = None

    def changed(self, model: Tracked, name: str) -> None:
        node = self.node
        if node is not None and node.alive:
            if name in node.spec.colls:
                node.store._replace_coll(model, node, name)
                return
            if name in node.spec.nodes:
                node.store._replace_child(model, node, name)
                return
        if name not in type(model).model_fields:
            return
        value = model.__dict__.get(name)
        armed = _arm(value, self.refs)
        if armed is not value:
            model.__dict__[name] = armed
        for ref in self.refs:
            ref.touch()


def _hook(model: Tracked) -> _Hook:
    try:
        hook: _Hook | None = object.__getattribute__(model, "_lf_hook")
    except AttributeError:
        hook = None
    if hook is None:
        hook = _Hook()
        object.__setattr__(model, "_lf_hook", hook)
    return hook


def _more(have: tuple[_Ref, ...], refs: tuple[_Ref, ...]) -> tuple[_Ref, ...] | None:
    """`have` plus those of `refs` it lacks; None when it lacks none."""
    new = tuple(r for r in refs if r not in have)
    return have + new if new else None


def _arm(value: Any, refs: tuple[_Ref, ...]) -> Any:
    """`value`, reporting its changes to `refs` from now on: models get a hook, lists and
    dicts become TList and TDict (a new object; already tracked ones are kept)."""
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, Tracked):
        hook = _hook(value)
        more = _more(hook.refs, refs)
        if more is None:
            return value  # already reports there, and so does all it holds
        hook.refs = more
        _arm_fields(value, refs)
        return value
    if isinstance(value, TList):
        more = _more(value._refs, refs)
        if more is not None:
            value._refs = more
            for i, item in enumerate(value):
                armed = _arm(item, refs)
                if armed is not item:
                    list.__setitem__(value, i, armed)
        return value
    if isinstance(value, TDict):
        more = _more(value._refs, refs)
        if more is not None:
            value._refs = more
            for k, item in list(dict.items(value)):
                armed = _arm(item, refs)
                if armed is not item:
                    dict.__setitem__(value, k, armed)
        return value
    if isinstance(value, list):
        out = TList(_arm(item, refs) for item in value)
        out._refs = refs
        return out
    if isinstance(value, dict):
        out_d = TDict({k: _arm(item, refs) for k, item in value.items()})
        out_d._refs = refs
        return out_d
    if isinstance(value, BaseModel):  # not Tracked: its containers at least
        _arm_fields(value, refs)
    return value


def _arm_fields(model: BaseModel, refs: tuple[_Ref, ...]) -> None:
    spec = _SCHEMA.get(type(model))
    skip = spec.exclude if spec is not None else ()
    for name in type(model).model_fields:
        if name in skip or name not in model.__dict__:
            continue
        value = model.__dict__[name]
        armed = _arm(value, refs)
        if armed is not value:
            model.__dict__[name] = armed


# -- containers that report their writes -----------------------------------------------------
class TList(list[Any]):
    """A list inside a persisted row: each write marks the row."""

    __slots__ = ("_refs",)
    _refs: tuple[_Ref, ...]

    def _changed(self) -> None:
        for ref in self._refs:
            ref.touch()

    def append(self, value: Any) -> None:
        super().append(_arm(value, self._refs))
        self._changed()

    def extend(self, values: Iterable[Any]) -> None:
        super().extend([_arm(v, self._refs) for v in values])
        self._changed()

    def insert(self, index: Any, value: Any) -> None:
        super().insert(index, _arm(value, self._refs))
        self._changed()

    def __setitem__(self, index: Any, value: Any) -> None:
        if isinstance(index, slice):
            value = [_arm(v, self._refs) for v in value]
        else:
            value = _arm(value, self._refs)
        super().__setitem__(index, value)
        self._changed()

    def __delitem__(self, index: Any) -> None:
        super().__delitem__(index)
        self._changed()

    def __iadd__(self, values: Iterable[Any]) -> TList:  # type: ignore[misc]
        self.extend(values)
        return self

    def __imul__(self, n: Any) -> TList:  # type: ignore[misc]
        super().__imul__(n)
        self._changed()
        return self

    def pop(self, index: Any = -1) -> Any:
        value = super().pop(index)
        self._changed()
        return value

    def remove(self, value: Any) -> None:
        super().remove(value)
        self._changed()

    def clear(self) -> None:
        super().clear()
        self._changed()

    def sort(self, *args: Any, **kwargs: Any) -> None:
        super().sort(*args, **kwargs)
        self._changed()

    def reverse(self) -> None:
        super().reverse()
        self._changed()

    def __reduce_ex__(self, protocol: Any) -> Any:  # copies and pickles are plain lists
        return (list, (list(self),))


class TDict(dict[Any, Any]):
    """A dict inside a persisted row (not a collection): each write marks the row."""

    __slots__ = ("_refs",)
    _refs: tuple[_Ref, ...]

    def _changed(self) -> None:
        for ref in self._refs:
            ref.touch()

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, _arm(value, self._refs))
        self._changed()

    def __delitem__(self, key: Any) -> None:
        super().__delitem__(key)
        self._changed()

    def pop(self, key: Any, *default: Any) -> Any:
        value = super().pop(key, *default)
        self._changed()
        return value

    def popitem(self) -> tuple[Any, Any]:
        item = super().popitem()
        self._changed()
        return item

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            super().__setitem__(key, _arm(value, self._refs))
        self._changed()

    def clear(self) -> None:
        super().clear()
        self._changed()

    def __ior__(self, other: Any) -> TDict:  # type: ignore[misc]
        self.update(other)
        return self

    def __reduce_ex__(self, protocol: Any) -> Any:  # copies and pickles are plain dicts
        return (dict, (dict(self),))


class _Coll(dict[Any, Any]):
    """One of the state's collections: each entry is a row of its own."""

    __slots__ = ("alive", "child", "path", "seq", "store")
    store: Snapshotter
    path: str
    child: type[Tracked] | None
    alive: bool
    seq: dict[Any, int]

    def touch(self, key: Any) -> None:
        if self.alive:
            self.store._touch(self, key)

    def _put(self, key: Any, value: Any) -> None:
        if not self.alive:
            super().__setitem__(key, value)
            return
        old = super().get(key, _MISSING)
        if old is value:
            self.touch(key)
            return
        if old is _MISSING:
            self.seq[key] = self.store._next_seq()
        elif isinstance(old, Tracked):
            self.store._detach(old)
        super().__setitem__(key, self.store._enter(self, key, value))
        self.touch(key)

    def _gone(self, key: Any, old: Any) -> None:
        if self.alive:
            self.seq.pop(key, None)
            if isinstance(old, Tracked):
                self.store._detach(old)
            self.touch(key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._put(key, value)

    def __delitem__(self, key: Any) -> None:
        old = super().pop(key)
        self._gone(key, old)

    def pop(self, key: Any, *default: Any) -> Any:
        if key in self:
            old = super().pop(key)
            self._gone(key, old)
            return old
        return super().pop(key, *default)

    def popitem(self) -> tuple[Any, Any]:
        key, old = super().popitem()
        self._gone(key, old)
        return key, old

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key not in self:
            self._put(key, default)
        return self[key]

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self._put(key, value)

    def clear(self) -> None:
        for key in list(self):
            del self[key]

    def __ior__(self, other: Any) -> _Coll:  # type: ignore[misc]
        self.update(other)
        return self

    def __reduce_ex__(self, protocol: Any) -> Any:  # copies and pickles are plain dicts
        return (dict, (dict(self),))


# -- the file ----------------------------------------------------------------------------------
def _private(path: Path) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)  # the forge's own directory (DATA/forge under `vaultmail up`)
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    for name in (path.name, path.name + "-wal", path.name + "-shm"):  # an older release's too
        with contextlib.suppress(FileNotFoundError):
            os.chmod(path.with_name(name), 0o600)


@dataclass
class SaveStats:
    """What the last save wrote (rows upserted or deleted, and the bytes of their values)."""

    rows: int = 0
    bytes: int = 0


class Snapshotter:
    def __init__(self, data_dir: str | Path) -> None:
        self.path = Path(data_dir) / FILENAME
        _private(self.path)
        self._db = sqlite3.connect(self.path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA temp_store=MEMORY")  # no secrets in temporary files
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS rows (coll TEXT NOT NULL, key TEXT NOT NULL,"
            " seq INTEGER NOT NULL, value TEXT NOT NULL, UNIQUE (coll, key))")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
        self._root: State | None = None
        self._dirty: dict[int, tuple[_Coll, set[Any]]] = {}
        self._dirty_own: dict[str, _Own] = {}
        self._dropped: set[str] = set()  # colls whose rows all go before this save's writes
        self._dropped_own: set[str] = set()
        self._wipe = False
        self._migrating = False
        self._loading: dict[str, dict[str, int]] | None = None
        self._seq = 1
        self._offset: float | None = None
        self.last = SaveStats()

    # -- load ------------------------------------------------------------------------------
    def load(self) -> tuple[State, float] | None:
        """The saved state (tracked from now on) and clock offset; None for a new file."""
        meta = dict(self._db.execute("SELECT name, value FROM meta").fetchall())
        by_coll: dict[str, list[tuple[str, int, str]]] = {}
        own: dict[str, str] = {}
        top = 0
        for coll, key, seq, value in self._db.execute(
                "SELECT coll, key, seq, value FROM rows ORDER BY seq, rowid"):
            top = max(top, seq)
            if coll == OWN:
                own[key] = value
            else:
                by_coll.setdefault(coll, []).append((key, seq, value))
        if "" not in own:
            return self._migrate()

        def fill(cls: type[BaseModel], data: dict[str, Any], path: str) -> dict[str, Any]:
            spec = _SCHEMA[cls]
            for name, child in spec.colls.items():
                sub = _join(path, name)
                entries: dict[str, Any] = {}
                for key, _, text in by_coll.get(sub, ()):
                    value = json.loads(text)
                    if child is not None:
                        value = fill(child, value, f"{sub}/{key}")
                    entries[key] = value
                data[name] = entries
            for name, node_cls in spec.nodes.items():
                sub = _join(path, name)
                data[name] = fill(node_cls, json.loads(own.get(sub, "{}")), sub)
            return data

        state = State.model_validate_json(json.dumps(fill(State, json.loads(own[""]), "")))
        self._seq = top + 1
        self._loading = {coll: {key: seq for key, seq, _ in rows}
                         for coll, rows in by_coll.items()}
        try:
            self.track(state)
        finally:
            self._loading = None
        self._clear()  # what was just read is what the file holds
        self._offset = float(meta.get("clock_offset", 0.0))
        return state, self._offset

    def _migrate(self) -> tuple[State, float] | None:
        """An older release's file: one snapshot of the whole state; rewritten as rows."""
        if self._db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table'"
                            " AND name = 'snapshot'").fetchone() is None:
            return None
        row = self._db.execute("SELECT state, clock_offset FROM snapshot WHERE id = 1").fetchone()
        if row is None:
            return None
        state, offset = State.model_validate_json(row[0]), float(row[1])
        self.track(state)
        self._migrating = True
        self.save(state, offset)
        self._db.execute("VACUUM")  # the snapshot's pages go back
        return state, offset

    # -- tracking --------------------------------------------------------------------------
    def track(self, state: State) -> None:
        """From now on, `state` is what this file holds (all of it rewritten on the next
        save, unless it was just loaded from here)."""
        if state is self._root:
            return
        if self._root is not None:
            self._detach(self._root)
            self._wipe = True
        self._adopt(state, "", _Own(self, state, ""))
        self._root = state

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _touch(self, coll: _Coll, key: Any) -> None:
        entry = self._dirty.get(id(coll))
        if entry is None:
            self._dirty[id(coll)] = (coll, {key})
        else:
            entry[1].add(key)

    def _enter(self, coll: _Coll, key: Any, value: Any) -> Any:
        ref = _Entry(coll, key)
        if coll.child is not None and isinstance(value, coll.child):
            self._adopt(value, f"{coll.path}/{_skey(key)}", ref)
            return value
        return _arm(value, (ref,))

    def _adopt(self, node: Tracked, path: str, own: _Ref) -> None:
        spec = _SCHEMA[type(node)]
        hook = _hook(node)
        hook.refs = _more(hook.refs, (own,)) or hook.refs
        binding = hook.node = _Binding(self, spec, path, own)
        for name, child in spec.colls.items():
            coll = self._coll(node.__dict__[name], _join(path, name), child)
            node.__dict__[name] = binding.colls[name] = coll
        for name in spec.nodes:
            sub = _join(path, name)
            kid = node.__dict__[name]
            binding.children[name] = kid
            self._adopt(kid, sub, _Own(self, kid, sub))
        _arm_fields(node, (own,))
        own.touch()

    def _coll(self, entries: dict[Any, Any], path: str, child: type[Tracked] | None) -> _Coll:
        coll = entries if isinstance(entries, _Coll) else _Coll(entries)
        coll.store, coll.path, coll.child, coll.alive = self, path, child, True
        if self._loading is not None:
            loaded = self._loading.get(path, {})
            coll.seq = {key: loaded[_skey(key)] for key in coll}
        else:
            coll.seq = {key: self._next_seq() for key in coll}
        self._dropped.add(path)  # all its rows rewritten: what the file had there goes
        for key, value in list(dict.items(coll)):
            armed = self._enter(coll, key, value)
            if armed is not value:
                dict.__setitem__(coll, key, armed)
            coll.touch(key)
        return coll

    def _detach(self, node: Tracked) -> None:
        """`node` left the state: its collections' and nested nodes' rows go."""
        try:
            hook: _Hook | None = object.__getattribute__(node, "_lf_hook")
        except AttributeError:
            return
        binding = hook.node if hook is not None else None
        if binding is None or not binding.alive or binding.store is not self:
            return
        binding.alive = False
        for coll in binding.colls.values():
            self._drop_coll(coll)
        for name, kid in binding.children.items():
            self._detach(kid)
            sub = _join(binding.path, name)
            self._dropped_own.add(sub)
            kid_hook = _hook(kid).node
            if kid_hook is not None and isinstance(kid_hook.own, _Own):
                kid_hook.own.alive = False

    def _drop_coll(self, coll: _Coll) -> None:
        if not coll.alive:
            return
        coll.alive = False
        self._dropped.add(coll.path)
        for value in dict.values(coll):
            if coll.child is not None and isinstance(value, coll.child):
                self._detach(value)

    def _replace_coll(self, node: Tracked, binding: _Binding, name: str) -> None:
        old = binding.colls.get(name)
        new = node.__dict__[name]
        if old is not None and old is not new:
            self._drop_coll(old)
        coll = self._coll(new, _join(binding.path, name), binding.spec.colls[name])
        node.__dict__[name] = binding.colls[name] = coll

    def _replace_child(self, node: Tracked, binding: _Binding, name: str) -> None:
        old = binding.children.get(name)
        kid = node.__dict__[name]
        sub = _join(binding.path, name)
        if old is not None:
            self._detach(old)
            old_binding = _hook(old).node
            if old_binding is not None and isinstance(old_binding.own, _Own):
                old_binding.own.alive = False
        self._dropped_own.add(sub)
        binding.children[name] = kid
        self._adopt(kid, sub, _Own(self, kid, sub))

    def _clear(self) -> None:
        self._dirty.clear()
        self._dirty_own.clear()
        self._dropped.clear()
        self._dropped_own.clear()
        self._wipe = False

    # -- save ------------------------------------------------------------------------------
    def _entry_json(self, coll: _Coll, key: Any) -> str:
        value = dict.__getitem__(coll, key)
        if coll.child is not None and isinstance(value, coll.child):
            return value.model_dump_json(exclude=_SCHEMA[coll.child].exclude)
        if isinstance(value, BaseModel):
            return value.model_dump_json()
        return to_json(value).decode()

    def save(self, state: State, clock_offset: float) -> None:
        """Write what changed since the last save (all of it for a state not yet tracked)."""
        self.track(state)
        upserts: list[tuple[str, str, int, str]] = []
        deletes: list[tuple[str, str]] = []
        for coll, keys in self._dirty.values():
            if not coll.alive:
                continue
            for key in keys:
                if dict.__contains__(coll, key):
                    upserts.append((coll.path, _skey(key), coll.seq[key],
                                    self._entry_json(coll, key)))
                else:
                    deletes.append((coll.path, _skey(key)))
        for own in self._dirty_own.values():
            if own.alive:
                spec = _SCHEMA[type(own.node)]
                upserts.append((OWN, own.path, 0, own.node.model_dump_json(exclude=spec.exclude)))
        offset_changed = clock_offset != self._offset
        if not (upserts or deletes or self._dropped or self._dropped_own or self._wipe
                or offset_changed or self._migrating):
            self.last = SaveStats()
            return
        db = self._db
        db.execute("BEGIN")
        try:
            if self._wipe:
                db.execute("DELETE FROM rows")
            db.executemany("DELETE FROM rows WHERE coll = ?", [(p,) for p in self._dropped])
            db.executemany("DELETE FROM rows WHERE coll = ? AND key = ?",
                           [(OWN, p) for p in self._dropped_own])
            db.executemany("DELETE FROM rows WHERE coll = ? AND key = ?", deletes)
            db.executemany(
                "INSERT INTO rows (coll, key, seq, value) VALUES (?, ?, ?, ?)"
                " ON CONFLICT(coll, key) DO UPDATE SET seq = excluded.seq,"
                " value = excluded.value", upserts)
            if offset_changed:
                db.execute("INSERT INTO meta (name, value) VALUES ('clock_offset', ?)"
                           " ON CONFLICT(name) DO UPDATE SET value = excluded.value",
                           (repr(float(clock_offset)),))
            if self._migrating:
                db.execute("DROP TABLE IF EXISTS snapshot")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self._offset = clock_offset
        self._migrating = False
        self.last = SaveStats(rows=len(upserts) + len(deletes),
                              bytes=sum(len(u[3]) for u in upserts))
        self._clear()

    def close(self) -> None:
        self._db.close()
