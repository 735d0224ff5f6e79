"""`vaultmail up` names the console on its ready line and prints a sign-in link per person."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
from pathlib import Path

import aiohttp

from tests.support import free_port


async def test_up_prints_the_console_and_a_sign_in_link_for_each_person(tmp_path: Path) -> None:
    port, forge_port = free_port(), free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli.main", "up", "--data", str(tmp_path), "--port",
        str(port), "--forge-port", str(forge_port), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL)
    assert proc.stdout is not None
    try:
        ready = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        app = f"http://127.0.0.1:{port}"
        assert "ready" in ready and f"app {app}" in ready and "tokens " in ready
        assert f"console {app}/console/" in ready
        found = {}
        for _ in range(12):  # the sign-in lines, among what else `up` prints (email, ...)
            line = (await asyncio.wait_for(proc.stdout.readline(), 10)).decode()
            m = re.match(r"  sign in as (\w+) \((\S+)\): (\S+)  \(forge password (\S+)\)$",
                         line.rstrip("\n"))
            if m:
                found[m[1]] = (m[3], m[4])
            if len(found) == 3:
                break
        assert set(found) == {"marco", "sara", "lee"}
        link, password = found["sara"]
        assert link == f"{app}/console/sign-in?login=sara"
        forge = f"http://127.0.0.1:{forge_port}"
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
            async with http.get(link) as resp:
                page = await resp.text()
            assert resp.status == 200 and "Sign in with the forge as sara" in page
            for tried, expected in (("wrong", 401), (password, 302)):
                async with http.get(f"{forge}/login") as resp:
                    form = await resp.text()
                token = re.search(r'name="authenticity_token" value="([^"]+)"', form)
                assert token, "the forge's sign-in form"
                async with http.post(f"{forge}/session", allow_redirects=False, data={
                        "login": "sara", "password": tried,
                        "authenticity_token": token[1]}) as resp:
                    assert resp.status == expected, (tried, resp.status)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
