"""Email in (issue 24): messages accepted a second, and the time from SMTP DATA to the mail's
issue on the forge (the listener answers 250 only once the issue is there, so DATA to 250 is
DATA to the issue).

The embedded default (SQLite) with its SMTP listener on loopback, DNS answered from an empty
table (SPF, DKIM and DMARC all `none`: no lookup time counted); a load client in its own
process (smtplib, `--concurrency` connections, one message each) sends `--messages` messages
from distinct senders to scout. Creations are paced under GitHub's 80 a minute as on a real
forge, so keep `--messages` within the first minute's burst (60) to measure the app, not the
limit.

Run: .venv/bin/python -m bench.email_intake [--messages 50] [--concurrency 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import smtplib
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from bench.common import ms, percentile, run_client
from bot.app.embedded import start_embedded
from bot.app.settings import EmailSettings


class _NoDns:
    def txt(self, name: str) -> list[str]:
        return []

    def addresses(self, name: str) -> list[str]:
        return []

    def mx(self, name: str) -> list[str]:
        return []


def _one(port: int, n: int) -> tuple[float, int]:
    msg = EmailMessage()
    msg["From"], msg["To"] = f"sender{n}@example.org", "scout@mail.acme.example"
    msg["Subject"], msg["Message-ID"] = f"Bench {n}", f"<bench-{n}@example.org>"
    msg.set_content(f"message {n}")
    with smtplib.SMTP("127.0.0.1", port, timeout=120) as client:
        start = time.perf_counter()
        refused = client.sendmail(msg["From"], ["scout@mail.acme.example"], msg.as_bytes())
        return time.perf_counter() - start, 0 if not refused else 1


def client_main() -> None:
    spec = json.loads(sys.stdin.read())
    with ThreadPoolExecutor(spec["concurrency"]) as pool:
        start = time.perf_counter()
        results = list(pool.map(lambda n: _one(spec["port"], n), range(spec["messages"])))
        wall = time.perf_counter() - start
    print(json.dumps({"latencies": [r[0] for r in results],
                      "failed": sum(r[1] for r in results), "wall": wall}))


async def run(messages: int, concurrency: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        emb = await start_embedded(data_dir=Path(tmp), port=0, forge_port=0,
                                   # acme's domain vouched for (bot.email.domains): no DNS
                                   email=EmailSettings(listen_port=0, sender_rate=10_000,
                                                       domains={"mail.acme.example": "acme"}),
                                   resolver=_NoDns())
        try:
            assert emb.smtp_port is not None
            result = await run_client("bench.email_intake", {
                "port": emb.smtp_port, "messages": messages, "concurrency": concurrency})
        finally:
            await emb.stop()
    latencies = result["latencies"]
    return {"messages": messages, "failed": result["failed"],
            "per_second": messages / result["wall"], "p50_ms": ms(percentile(latencies, 50)),
            "p99_ms": ms(percentile(latencies, 99))}


def main() -> None:
    if "--client" in sys.argv:
        client_main()
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=5)
    args = parser.parse_args()
    row = asyncio.run(run(args.messages, args.concurrency))
    print(f"messages {row['messages']}  failed {row['failed']}  "
          f"accepted {row['per_second']:.1f}/s  DATA to issue p50 {row['p50_ms']} ms  "
          f"p99 {row['p99_ms']} ms")


if __name__ == "__main__":
    main()
