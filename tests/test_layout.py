"""The tree is the map: no module of the product imports in a circle (type-only and
function-local imports count too: a circle there is still a circle in the design), and the
local forge imports nothing from the product."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("bot", "handlers", "labels")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The project modules `path` imports (`from pkg import name` naming a module counts)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _graph(packages: tuple[str, ...]) -> dict[str, set[str]]:
    files = [p for pkg in packages for p in (ROOT / pkg).rglob("*.py")
             if "tests" not in p.relative_to(ROOT).parts]
    modules = {_module_name(p) for p in files}
    graph = {_module_name(p): _imports(p, modules) for p in files}
    # a package's __init__ re-exporting its own modules is not a dependency back on them
    return {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_module_of_the_product_imports_in_a_circle() -> None:
    assert _cycles(_graph(PRODUCT)) == []


def test_the_local_forge_imports_nothing_from_the_product() -> None:
    files = [p for p in (ROOT / "localforge").rglob("*.py")
             if "tests" not in p.relative_to(ROOT).parts]
    offenders = {}
    for path in files:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""] if not node.level else []
                depth = len(path.relative_to(ROOT / "localforge").parts)
                if node.level and node.level > depth:
                    names = ["<relative import above localforge>"]
            else:
                continue
            bad = [n for n in names if n.split(".")[0] in PRODUCT or n.startswith("<")]
            if bad:
                offenders[str(path.relative_to(ROOT))] = bad
    assert offenders == {}


def test_the_checker_sees_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


SQL_CALLS = {"execute", "executemany", "executescript", "fetchall", "fetchone"}


def _sql_calls(path: Path) -> list[str]:
    """Each `x.execute(` / `.executemany(` / `.executescript(` / `.fetchall(` / `.fetchone(`
    in `path`, as `line: name`."""
    return [f"{node.lineno}: {node.func.attr}" for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in SQL_CALLS]


def test_no_query_lives_outside_the_store() -> None:
    """Issue 13's rule: only `bot.store` speaks SQL; everything else calls its functions, so
    another engine can take its place."""
    offenders = {}
    for pkg in PRODUCT:
        for path in (ROOT / pkg).rglob("*.py"):
            rel = path.relative_to(ROOT)
            if "tests" in rel.parts or rel.parts[:2] == ("bot", "store"):
                continue
            if found := _sql_calls(path):
                offenders[str(rel)] = found
    assert offenders == {}


def test_the_checker_sees_a_query(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text("async def f(store, db):\n    await store.fetchone('SELECT 1')\n"
                    "    async with db.execute('SELECT 2') as cur:\n        await cur.fetchall()\n"
                    "    run._execute()\n")
    assert sorted(_sql_calls(path)) == ["2: fetchone", "3: execute", "4: fetchall"]
