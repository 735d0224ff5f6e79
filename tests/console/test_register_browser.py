"""Registration from app.yml in a real browser, as an operator goes through it: signed in to
the forge, they open the page `vaultmail register` serves, press its button (the manifest
form posts to the forge), come back to the page that trades the code for the App's
credentials, follow its "Install it" link and install the App on their organisation. The
HTTP version of the same flow, with `serve` afterwards, is tests/app/test_register.py."""

from __future__ import annotations

import asyncio
import re
import stat
from pathlib import Path

import pytest
from playwright.async_api import BrowserContext, Route, expect

from bot.office.config import load_office
from bot.office.seed import seed_office
from localforge import LocalForge
from tests.app.test_register import _cli, _env_file, _line, _setup_link, _stop
from tests.support import free_port

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_an_operator_registers_and_installs_the_app_in_the_browser(
        context: BrowserContext, tmp_path: Path) -> None:
    forge = LocalForge()
    await forge.start()
    seed_office(forge, load_office())
    reg_port, app_port = free_port(), free_port()
    app_url = f"http://127.0.0.1:{app_port}"
    env_path = tmp_path / ".env"
    register = await _cli("register", "--org", "acme", "--forge", forge.url, "--url", app_url,
                          "--port", str(reg_port), "--env-file", str(env_path), cwd=tmp_path)
    installed: list[str] = []

    async def the_app(route: Route) -> None:  # the App itself is not running in this test
        installed.append(route.request.url)
        await route.fulfill(status=200, content_type="text/html",
                            body="<h1>vaultmail is installed</h1>")

    try:
        link = _setup_link(await _line(register.stdout, "/setup"))  # (its key in it)
        await context.route(re.compile(re.escape(app_url) + ".*"), the_app)
        page = await context.new_page()
        await page.goto(f"{forge.url}/login?return_to=/")
        await page.get_by_label("Username or email address").fill("admin")
        await page.get_by_label("Password").fill(forge.user_password("admin"))
        await page.get_by_role("button", name="Sign in").click()

        assert link.startswith(f"http://127.0.0.1:{reg_port}/setup?key=")
        await page.goto(link)
        await page.get_by_role("button", name=re.compile("^Register on")).click()
        install = page.get_by_role("link", name="Install it")
        await expect(install).to_be_visible()
        assert await asyncio.wait_for(register.wait(), 30) == 0, "register exits once done"

        await install.click()
        await page.get_by_role("button", name="Install on acme").click()
        await expect(page.get_by_role("heading", name="vaultmail is installed")).to_be_visible()
    finally:
        await _stop(register)
        await forge.stop()

    (app,) = [a for a in forge.state.apps.values() if a.slug == "vaultmail"]
    assert app.owner == "acme" and app.webhook_url == f"{app_url}/webhook"
    assert [inst for inst in forge.state.installations.values()
            if inst.app_id == app.id and inst.account.lower() == "acme"], "installed on acme"
    assert installed and installed[0].startswith(f"{app_url}/setup/installed?"), installed
    assert "setup_action=install" in installed[0]
    assert stat.S_IMODE(env_path.stat().st_mode) == 0o600
    values = _env_file(env_path)
    assert values["APP_ID"] == str(app.id) and values["WEBHOOK_SECRET"] == app.webhook_secret
