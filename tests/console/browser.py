"""Driving the console in Debian's Chromium with Playwright: sign-in, accessibility checks."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from playwright.async_api import Page, expect

from bot.app.embedded import Embedded

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
ROOT = Path(__file__).resolve().parents[2]
AXE = Path(__file__).parent / "vendor" / "axe.min.js"
ARTIFACTS = ROOT / "test-artifacts"
PHONE = {"width": 390, "height": 844}


async def sign_in_with_forge(page: Page, office: Embedded, login: str) -> None:
    """The OAuth web flow as a person goes through it: the console sends them to the forge,
    they sign in there with their password and authorize the App, and come back signed in."""
    await page.goto(office.app_url + "/console/inbox")
    await expect(page).to_have_url(re.compile(r"/console/sign-in"))
    await page.get_by_role("link", name="Sign in with the forge").click()
    await page.get_by_label("Username or email address").fill(login)
    await page.get_by_label("Password").fill(office.forge.user_password(login))
    await page.get_by_role("button", name="Sign in").click()
    authorize = page.get_by_role("button", name=re.compile("^Authorize"))
    await authorize.click()
    await expect(page).to_have_url(re.compile(r"/console/inbox$"))


async def sign_in_with_token(page: Page, office: Embedded, principal: str) -> None:
    await page.goto(office.app_url + "/console/sign-in")
    await page.get_by_label("API token", exact=True).fill(office.api_tokens[principal])
    await page.get_by_role("button", name="Sign in", exact=True).click()
    await expect(page).to_have_url(re.compile(r"/console/inbox$"))


async def live(page: Page, timeout: float = 5_000) -> None:
    """Wait until the page's live stream has had its first event (it is listening)."""
    await expect(page.locator("body")).to_have_attribute("data-stream", "open",
                                                         timeout=timeout)


async def axe_violations(page: Page) -> list[dict[str, Any]]:
    """axe-core's serious and critical violations on the page as it is now."""
    await page.add_script_tag(path=str(AXE))
    result: dict[str, Any] = await page.evaluate(
        "async () => await axe.run(document, {resultTypes: ['violations']})")
    return [{"id": v["id"], "impact": v["impact"], "help": v["help"],
             "nodes": [n["target"] for n in v["nodes"]][:5]}
            for v in result["violations"] if v["impact"] in ("serious", "critical")]


async def assert_accessible(page: Page) -> None:
    found = await axe_violations(page)
    assert found == [], found


async def shot(page: Page, name: str) -> None:
    """A screenshot for the README: in test-artifacts/ always, and in docs/ (committed) when
    VAULTMAIL_SCREENSHOTS=docs is set."""
    ARTIFACTS.mkdir(exist_ok=True)
    await page.screenshot(path=str(ARTIFACTS / name), full_page=True)
    if os.environ.get("VAULTMAIL_SCREENSHOTS") == "docs":
        await page.screenshot(path=str(ROOT / "docs" / name), full_page=True)
