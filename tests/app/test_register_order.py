"""Issue 23: `vaultmail register`'s next steps, followed in the order it prints them, each work:
installing sends the browser to the App's setup URL on the app, so the app must run by then.
A newcomer does exactly what the register command and its page say, one step after another."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from bot.office.config import load_office
from bot.office.seed import seed_office
from localforge import LocalForge
from tests.app.test_register import (
    _cli,
    _install,
    _line,
    _parse,
    _setup_link,
    _stop,
    _submit_to_forge,
    _text,
    _until_serving,
)
from tests.support import free_port


@pytest.fixture
async def forge() -> AsyncIterator[LocalForge]:
    forge = LocalForge()
    await forge.start()
    seed_office(forge, load_office())
    try:
        yield forge
    finally:
        await forge.stop()


async def test_the_steps_register_prints_work_in_the_order_it_prints_them(
        forge: LocalForge, tmp_path: Path) -> None:
    admin = forge.user_token("admin")
    reg_port, app_port = free_port(), free_port()
    app_url = f"http://127.0.0.1:{app_port}"
    env_path = tmp_path / ".env"
    env_path.write_text(f"HOST=127.0.0.1\nPORT={app_port}\nVAULTMAIL_DATA={tmp_path / 'data'}\n")
    serve: asyncio.subprocess.Process | None = None
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:
        register = await _cli("register", "--org", "acme", "--forge", forge.url, "--url",
                              app_url, "--port", str(reg_port), "--env-file", str(env_path),
                              cwd=tmp_path)
        try:
            form = _parse(await _text(session, _setup_link(await _line(register.stdout,
                                                                       "/setup"))))
            callback = await _submit_to_forge(session, form, admin)
            page = await _text(session, callback)
            out, _ = await asyncio.wait_for(register.communicate(), 60)
            assert register.returncode == 0
        finally:
            await _stop(register)

        steps = out.decode().splitlines()
        after = steps[[i for i, s in enumerate(steps) if s.startswith("registered ")][0] + 1:]
        done = []
        try:
            for step in after:
                if "installations/new" in step:
                    install_url = re.search(r"(http\S+/installations/new)", step)
                    assert install_url is not None, step
                    setup_url = await _install(session, install_url[1], "acme", admin)
                    assert setup_url.startswith(f"{app_url}/setup/installed?"), setup_url
                    try:  # where the forge sends the browser once the App is installed
                        landed = await _text(session, setup_url)
                    except aiohttp.ClientConnectionError as exc:
                        raise AssertionError(f"after {done}, {step!r} sends the browser to "
                                             f"{setup_url}, where nothing answers") from exc
                    assert "installed" in landed.lower()
                    done.append("install")
                elif "vaultmail serve" in step:
                    serve = await _cli("serve", cwd=tmp_path)
                    await _until_serving(session, app_url, serve)
                    done.append("serve")
            assert done == ["serve", "install"], (done, after)

            # the page says the same, in the same order: serve first, then install
            text = re.sub(r"<[^>]+>", "", page)
            assert "vaultmail serve" in text and "install it" in text, text
            assert text.index("vaultmail serve") < text.index("install it"), text
        finally:
            if serve is not None:
                assert await _stop(serve) == 0
