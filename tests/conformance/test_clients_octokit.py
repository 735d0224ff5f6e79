"""Octokit, unmodified (@octokit/rest, @octokit/plugin-throttling, @octokit/plugin-retry,
@octokit/auth-app, from the npm registry: the `octokit` fixture runs `npm ci` in
tests/conformance/octokit/ when its packages are not there, or names what to install),
run by the machine's Node.js against the local forge: octokit/scenario.mjs prints JSON results,
checked here. Issues, labels, comments, pagination (Link and search), conditional requests,
errors, App authentication, raw contents, list filters, and both plugins at work."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests import needs

from .conftest import ORG, World

HERE = Path(__file__).parent / "octokit"
REPO = "scout-vault"


@pytest.fixture(scope="session")
def octokit() -> str:
    """Node.js, with the Octokit packages installed (`npm ci`, once) next to scenario.mjs."""
    try:
        needs.npm_modules(HERE)
        return needs.program("node", "nodejs", "Node.js (for the Octokit conformance test)")
    except needs.Missing as exc:
        pytest.fail(str(exc), pytrace=False)


async def _run(world: World, tmp_path: Path, node: str) -> dict[str, Any]:
    key = tmp_path / "app.pem"
    key.write_bytes(world.key.private_pem)
    env = dict(os.environ, FORGE_URL=world.url, APP_ID=str(world.app_id),
               PRIVATE_KEY_PATH=str(key), OWNER=ORG, REPO=REPO,
               FAULTS_URL=world.url + "/_forge/faults")
    proc = await asyncio.create_subprocess_exec(
        node, str(HERE / "scenario.mjs"), cwd=HERE, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert out, f"node printed nothing (exit {proc.returncode}): {err.decode()[-2000:]}"
    result: dict[str, Any] = json.loads(out)
    assert proc.returncode == 0 and "error" not in result, (result.get("error"),
                                                            err.decode()[-2000:])
    return result


async def test_octokit_drives_the_forge_as_it_drives_github(world: World, tmp_path: Path,
                                                            octokit: str) -> None:
    r = await _run(world, tmp_path, octokit)
    assert r["app"] == {"slug": "vaultmail", "installation": world.installation_id}
    assert r["label"] == {"name": "mail:new", "archived_at": None}
    made = r["made"]
    assert sorted(r["listed"]) == sorted(made)  # two pages of two
    assert sorted(r["searched"]) == sorted(made)  # paginate over search's items
    assert r["mentioned"] == [made[0]] and r["milestoneAny"] == 0
    assert r["milestoneMissing"]["status"] == 422
    assert r["raw"] == {"type": "string", "text": world.forge.state.repo(
        ORG, ".github").files["vaultmail.yml"]}
    assert r["comments"] == ["edited"] and r["left"] == ["mail:working"]
    assert r["closed"] == "closed"
    assert r["conditional"]["status"] == 304
    assert r["missing"]["status"] == 404 and r["missing"]["message"] == "Not Found"
    assert r["duplicate"]["status"] == 422
    assert r["duplicate"]["errors"][0]["code"] == "already_exists"
    # throttling saw the secondary limit, waited its Retry-After and the retry landed
    assert [s["retryAfter"] for s in r["secondary"]] == [1]
    assert r["afterSecondary"]["status"] == 201
    assert r["afterServerError"]["status"] == 200  # plugin-retry retried the 502
    assert r["throttled"] == []
    refused = [x for x in world.forge.requests if x.status in (403, 502)]
    assert [x.route for x in refused] == [
        "POST /repos/{owner}/{repo}/issues/{issue_number}/comments",
        "GET /repos/{owner}/{repo}/issues/{issue_number}"]
