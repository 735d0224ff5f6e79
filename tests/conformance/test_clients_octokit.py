"""Octokit, unmodified (@octokit/rest, @octokit/plugin-throttling, @octokit/plugin-retry,
@octokit/auth-app, from the npm registry, `npm ci` in tests/conformance/octokit/ by .ci/run),
run by the machine's Node.js against the local forge: octokit/scenario.mjs prints JSON results,
checked here. Issues, labels, comments, pagination (Link and search), conditional requests,
errors, App authentication, raw contents, list filters, and both plugins at work."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path
from typing import Any

from .conftest import ORG, World

HERE = Path(__file__).parent / "octokit"
REPO = "scout-vault"


async def _run(world: World, tmp_path: Path) -> dict[str, Any]:
    node = shutil.which("node")
    assert node is not None, "Node.js is needed (Debian's nodejs, as on CI)"
    assert (HERE / "node_modules" / "@octokit" / "rest").is_dir(), (
        f"run `npm ci` in {HERE} (.ci/run does)")
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


async def test_octokit_drives_the_forge_as_it_drives_github(world: World,
                                                            tmp_path: Path) -> None:
    r = await _run(world, tmp_path)
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
