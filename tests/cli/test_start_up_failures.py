"""Issue 23's start-up failures not covered beside their commands: `register` and `serve`
before an App is registered (its setup page) with their port in use are one line naming the
port and what to do, exit 2, no traceback, nothing written. (`up`: tests/test_up.py; `serve`
registered: tests/app/test_serve_lifecycle.py; `forge`, `up --office`: test_rough_edges.py.)"""

from __future__ import annotations

import socket
from pathlib import Path

from tests.cli.test_rough_edges import _run


async def test_register_and_the_setup_page_with_their_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        runs = {
            "register": (["register", "--host", "127.0.0.1", "--port", port, "--url",
                          "https://vaultmail.example.com"], {}),
            "serve's setup page": (["serve"], {"HOST": "127.0.0.1", "PORT": port,
                                               "VAULTMAIL_DATA": str(tmp_path / "data")}),
        }
        for what, (argv, env) in runs.items():
            code, out, err = await _run(*argv, cwd=tmp_path, env=env)
            lines = [x for x in err.splitlines() if x.strip()]
            assert code == 2 and len(lines) == 1 and "Traceback" not in err, (what, code, err)
            assert f"cannot listen on 127.0.0.1:{port}" in lines[0], (what, lines[0])
            assert "--port" in lines[0] and "Unclosed" not in err, (what, lines[0])
            assert out == "", (what, out)
    assert not (tmp_path / ".env").exists(), "register wrote nothing"


async def test_serve_keeps_what_its_start_made_out_of_later_collections() -> None:
    """Once started, `serve` freezes its start-up heap and collects its youngest objects less
    often (bench.probot_compare: the collector was 5.5 % of its CPU)."""
    import asyncio
    import gc

    from bot.cli.main import GC_THRESHOLDS, _tune_gc_once

    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    ready = asyncio.Event()
    try:
        gc.set_threshold(700, 10, 10)  # Python's own (the tests run with serve's: conftest)
        ready.set()
        await _tune_gc_once(ready)
        assert gc.get_threshold() == GC_THRESHOLDS
        assert gc.get_freeze_count() > frozen
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
