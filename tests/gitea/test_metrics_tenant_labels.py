"""What one org can put into /metrics, which anyone may read (review 11): on Gitea each org
signs the deliveries of its own webhook (/webhook/<org>, a secret its admins hold), and the
event a delivery names (`X-Gitea-Event`) was a label value of the deliveries counter and of
the handler histogram: one org choosing a new name per delivery grew the process's memory,
and every scrape, without end."""

from __future__ import annotations

import hashlib
import hmac
import json
import re

import aiohttp

from bot.app.embedded import Embedded
from tests.gitea.test_two_orgs_on_gitea import _evil_seen, _secret


async def test_an_orgs_event_names_do_not_become_metric_labels(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    await _evil_seen(office)
    secret = _secret(office, "evil")
    body = json.dumps({"action": "x", "repository": {
        "full_name": "evil/junk", "name": "junk", "owner": {"login": "evil"}},
        "sender": {"login": "mallory"}}).encode()
    mac = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    for n in range(300):
        async with session.post(office.app_url + "/webhook/evil", data=body, headers={
                "Content-Type": "application/json", "X-Gitea-Delivery": f"junk-{n}",
                "X-Gitea-Event": f"junk{n}_" + "x" * 2000, "X-Gitea-Signature": mac}) as resp:
            assert resp.status == 202, await resp.text()
    await office.settle()
    async with session.get(office.app_url + "/metrics") as resp:
        text = await resp.text()
    events = set(re.findall(r'vaultmail_deliveries_total\{event="([^"]*)"', text))
    assert not [e for e in events if e.startswith("junk")], (
        f"{len(events)} event labels, {len(text):,} bytes of /metrics")
