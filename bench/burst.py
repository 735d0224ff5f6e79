"""A burst of mail under GitHub's secondary limits, on the forge clock.

The embedded default's forge applies GitHub's secondary limits (80 content creations a minute,
500 an hour, `localforge/limits.py`) on its clock. As the forge tests do (`fast_time`), the
app's forge client is handed sleep/monotonic that move that clock instead of waiting, and its
tokens are reckoned on it, so an hour of pacing passes in seconds of real time; the app's
pacer is rebuilt with them (same settings as the app's). Four senders (two people, two
agents) then send N mails at once over HTTP (`mail_send`), all through the one installation.
Reported: refusals (403/429 on a creation), creations, the time from the first creation to the
last on the forge clock against the fastest the limits allow (creation k no earlier than
creation k-80 + 60 s and creation k-500 + 3600 s), and the wall time. Rows: a burst within
the hourly limit, one past it, and the first again with a fixed 0.75 s between writes (what a
pacer without a burst budget would need to stay under 80 a minute), side by side in one run.

Run: .venv/bin/python -m bench.burst
Target (DESIGN §6): no refusal, and within 5 % of the fastest the limits allow.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bot.app.embedded import Embedded, start_embedded
from bot.forge.github import ForgeClient
from bot.forge.pacing import WritePacer

SENDERS = [("human:marco@acme.com", "scout"), ("human:sara@acme.com", "builder"),
           ("agent:scout", "critic"), ("agent:builder", "scout")]
CREATE_ISSUE = "POST /repos/{owner}/{repo}/issues"
TARGET = 0.05


def fastest(n: int, per_minute: int, per_hour: int) -> float:
    """Seconds from the first of n creations to the last when each goes at its earliest."""
    times: list[float] = []
    for k in range(n):
        t = times[-1] if times else 0.0
        if k >= per_minute:
            t = max(t, times[k - per_minute] + 60.0)
        if k >= per_hour:
            t = max(t, times[k - per_hour] + 3600.0)
        times.append(t)
    return times[-1] if times else 0.0


def use_forge_clock(embedded: Embedded, write_interval: float) -> None:
    """The app's forge client sleeps by moving the forge clock; a fresh pacer on it."""
    forge = embedded.forge
    client = embedded.services.forge_client
    assert isinstance(client, ForgeClient), "the burst runs against the GitHub dialect"

    async def sleep(seconds: float) -> None:
        forge.clock.advance(seconds)
        await asyncio.sleep(0)

    client.sleep = sleep
    client.monotonic = forge.clock.now
    client.auth.clock = forge.clock
    cfg = client.config
    installation = embedded.services.default_installation
    assert installation is not None
    client.installation(installation).pacer = WritePacer(
        min_interval=write_interval, content_per_minute=cfg.content_per_minute,
        content_per_hour=cfg.content_per_hour, monotonic=forge.clock.now, sleep=sleep)


async def burst(embedded: Embedded, n: int, write_interval: float) -> dict[str, Any]:
    await embedded.settle()
    embedded.forge.clock.advance(3700)  # every window of the forge and the pacer is empty
    use_forge_clock(embedded, write_interval)
    before = len(embedded.forge.requests.records)
    start = time.perf_counter()
    async with aiohttp.ClientSession() as session:
        async def sender(principal: str, to: str, count: int) -> list[int]:
            headers = {"Authorization": f"Bearer {embedded.api_tokens[principal]}"}
            statuses = []
            for i in range(count):
                async with session.post(
                        f"{embedded.app_url}/api/v1/tools/mail_send", headers=headers,
                        json={"to": to, "subject": f"Burst {i}", "body": "Numbers attached.",
                              "idempotencyKey": f"burst-{n}-{write_interval}-{i}"}) as resp:
                    await resp.read()
                    statuses.append(resp.status)
            return statuses

        shares = [n // len(SENDERS) + (1 if k < n % len(SENDERS) else 0)
                  for k in range(len(SENDERS))]
        answers = await asyncio.gather(*(sender(p, to, c)
                                         for (p, to), c in zip(SENDERS, shares, strict=True)))
    wall = time.perf_counter() - start
    await embedded.settle()
    records = embedded.forge.requests.records[before:]
    creations = [r for r in records if r.route == CREATE_ISSUE and r.status == 201]
    refusals = [r for r in records if r.method != "GET" and r.status in (403, 429)]
    other = [r for r in records if r.status == 201 and r.route != CREATE_ISSUE
             and r.auth == "installation"]
    limits = embedded.forge.limits
    best = fastest(len(creations), limits.secondary_per_minute, limits.secondary_per_hour)
    took = creations[-1].at - creations[0].at if creations else 0.0
    return {"n": n, "ok": sum(s == 200 for a in answers for s in a), "creations": len(creations),
            "other": len(other), "refusals": len(refusals), "took": took, "best": best,
            "wall": wall}


async def main() -> None:
    embedded = await start_embedded(data_dir=Path(tempfile.mkdtemp()), port=0, forge_port=0)
    rows: list[list[str]] = []
    try:
        limits = embedded.forge.limits
        for n, interval, label in [(400, 0.0, "the app's pacing (budget, no fixed interval)"),
                                   (560, 0.0, "the app's pacing (budget, no fixed interval)"),
                                   (400, 0.75, "a fixed 0.75 s between writes")]:
            r = await burst(embedded, n, interval)
            over = (r["took"] - r["best"]) / r["best"] if r["best"] else 0.0
            ok = r["refusals"] == 0 and over <= TARGET and r["creations"] == n
            rows.append([
                str(n), label, f"{r['ok']}", f"{r['creations']} (+{r['other']} other)",
                str(r["refusals"]), f"{r['took']:.1f}", f"{r['best']:.1f}",
                f"{r['took'] / r['best']:.3f} ({over * 100:+.1f} %)" if r["best"] else "-",
                f"{r['wall']:.1f}", f"{'OK' if ok else 'FAIL'} (0 refused, <= +5 %)"])
    finally:
        await embedded.stop()
    print("command: .venv/bin/python -m bench.burst\n")
    print(f"forge limits: {limits.secondary_per_minute} creations a minute, "
          f"{limits.secondary_per_hour} an hour (GitHub's); time on the forge clock, moved by "
          "the client's sleeps\n")
    head = ["mails", "app write pacing", "sends answered 200", "issues created",
            "refusals", "first to last creation s", "fastest allowed s", "ratio",
            "wall s", "target"]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    asyncio.run(main())
