"""An operator's first contact: configuration from the environment or `.env` under Probot's
names, one clear line for a wrong value, and JSON logs that say which delivery they are about."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import signal
import sys
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from bot.app.embedded import Embedded
from bot.app.logs import setup_logging
from bot.app.settings import Settings, SettingsError
from tests.support import Actor

ROOT = Path(__file__).resolve().parents[2]


def _pem() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def test_probot_names_are_accepted_beside_github_ones() -> None:
    pem = _pem()
    s = Settings.from_env({"APP_ID": "42", "PRIVATE_KEY": pem.replace("\n", "\\n"),
                           "WEBHOOK_SECRET": "s3cret", "LOG_LEVEL": "trace"})
    assert (s.app_id, s.webhook_secret, s.log_level) == ("42", "s3cret", "debug")
    assert s.private_key_pem.strip() == pem.strip(), "a one-line PRIVATE_KEY is a PEM again"
    assert s.api_url == "https://api.github.com"


def test_github_enterprise_server_works_by_setting_its_host(tmp_path: Path) -> None:
    key = tmp_path / "app.pem"
    key.write_text(_pem())
    s = Settings.from_env({"GITHUB_APP_ID": "7", "PRIVATE_KEY_PATH": str(key),
                           "GITHUB_WEBHOOK_SECRET": "x", "GHE_HOST": "ghe.acme.test"})
    assert s.api_url == "https://ghe.acme.test/api/v3"


def test_settings_are_read_from_dot_env_after_the_environment(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    key = tmp_path / "app.pem"
    key.write_text(_pem())
    env_file = tmp_path / ".env"
    env_file.write_text(f"APP_ID=99\nPRIVATE_KEY_PATH={key}\nWEBHOOK_SECRET=from-file\n"
                        "PORT=9001\n")
    for name in ("APP_ID", "GITHUB_APP_ID", "WEBHOOK_SECRET", "GITHUB_WEBHOOK_SECRET",
                 "PRIVATE_KEY", "GITHUB_PRIVATE_KEY", "GITHUB_PRIVATE_KEY_PATH", "GITEA_URL",
                 "GITEA_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PORT", "9002")  # the environment wins over the file
    s = Settings.from_env(env_file=env_file)
    assert (s.app_id, s.webhook_secret, s.port) == ("99", "from-file", 9002)


@pytest.mark.parametrize(("env", "says"), [
    ({"APP_ID": "vaultmail"}, "APP_ID='vaultmail': should be the App's numeric id"),
    ({"PORT": "99999"}, "PORT='99999': should be a port number from 1 to 65535"),
    ({"LOG_LEVEL": "loud"}, "LOG_LEVEL='loud': should be one of debug, info"),
    ({"VAULTMAIL_RECONCILE_SECONDS": "-1"}, "VAULTMAIL_RECONCILE_SECONDS='-1': should be"),
])
def test_a_wrong_value_names_the_variable_and_what_it_should_hold(env: dict[str, str],
                                                                  says: str) -> None:
    base = {"APP_ID": "1", "PRIVATE_KEY": _pem(), "WEBHOOK_SECRET": "s"}
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({**base, **env})
    assert str(caught.value).startswith(says)
    assert "\n" not in str(caught.value)


async def test_serve_with_a_wrong_value_stops_with_one_line_and_no_traceback(
        tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "APP_ID": "1",
           "PRIVATE_KEY": _pem(), "WEBHOOK_SECRET": "s", "PORT": "http"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli.main", "serve", cwd=str(tmp_path), env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    lines = err.decode().strip().splitlines()
    assert lines == ["vaultmail: PORT='http': should be a port number from 1 to 65535"], lines
    assert b"Traceback" not in err + out


@pytest.fixture
def log_lines(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    stream = io.StringIO()
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    monkeypatch.setattr(sys, "stderr", stream)
    setup_logging("debug")
    try:
        yield stream
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)


def _parsed(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


async def test_every_line_inside_a_delivery_carries_its_ids_and_keeps_its_own_fields(
        embedded: Embedded, person: Any, log_lines: io.StringIO) -> None:
    marco: Actor = person("marco")
    issue = await marco.open_issue("acme/scout-vault", "Prices", "EU prices please")
    await embedded.settle()
    await marco.comment("acme/scout-vault", issue["number"], "/mail nobody Hello\nHi.")
    await embedded.settle()
    lines = _parsed(log_lines)
    refused = [x for x in lines if x["msg"] == "refused"]
    assert refused, "a /mail to an unknown agent is refused in the log"
    line = refused[-1]
    assert line["event"] == "issue_comment" and line["action"] == "created"
    assert line["delivery_id"] and line["installation_id"]
    assert line["reason"] and line["issue"] == f"acme/scout-vault#{issue['number']}", \
        "the line keeps its own fields beside the delivery's"
    forge_lines = [x for x in lines if x.get("logger", "").startswith("vaultmail.forge")
                   and x.get("delivery_id") == line["delivery_id"]]
    assert forge_lines, "the forge layer's lines carry the delivery id too"
    stamp = line["time"]
    assert stamp.endswith("Z") and len(stamp.split(".")[-1]) == 4, stamp  # "SS.mmmZ"
    assert line["level"] == "info"


async def _lines_of_up(tmp_path: Path, flags: list[str], env: dict[str, str]
                       ) -> list[dict[str, Any]]:
    """Run `vaultmail [flags] up` until it is ready, stop it (SIGTERM); its log lines."""
    stderr = tmp_path / "stderr.log"
    with stderr.open("wb") as err:  # a file: a pipe nobody reads would fill and stall it
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot.cli.main", *flags, "up", "--data", str(tmp_path / "data"),
            "--port", "0", "--forge-port", "0", cwd=str(tmp_path),
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **env},
            stdout=asyncio.subprocess.PIPE, stderr=err)
        assert proc.stdout is not None
        try:
            line = (await asyncio.wait_for(proc.stdout.readline(), 180)).decode()
            assert line.startswith("vaultmail ready:"), (line, stderr.read_text())
        finally:
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, stderr.read_text()
    return [json.loads(x) for x in stderr.read_text().splitlines() if x.strip()]


def _forge_debug_lines(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The forge layer's line for each request (`GET /app/installations -> 200`): debug."""
    return [x for x in lines if x["level"] == "debug"
            and x.get("logger", "").startswith("vaultmail.forge") and " -> " in x["msg"]]


@pytest.mark.parametrize(("flags", "env", "debug"), [
    (["--log-level", "debug"], {}, True),
    ([], {"LOG_LEVEL": "debug"}, True),  # no flag: LOG_LEVEL is honoured
    ([], {}, False),  # neither: warning for `up`
    (["--log-level", "warning"], {"LOG_LEVEL": "debug"}, False),  # the flag wins
], ids=["flag", "LOG_LEVEL", "default", "flag-over-LOG_LEVEL"])
async def test_log_level_debug_from_the_flag_or_log_level_shows_the_forge_requests(
        tmp_path: Path, flags: list[str], env: dict[str, str], debug: bool) -> None:
    lines = await _lines_of_up(tmp_path, flags, env)
    requests = _forge_debug_lines(lines)
    if debug:
        assert requests, [x["msg"] for x in lines][:20]
        assert all(x["time"].endswith("Z") for x in requests)
    else:
        assert not [x for x in lines if x["level"] == "debug"], lines[:5]



async def test_a_log_line_escapes_every_control_character_others_wrote(
        embedded: Embedded, log_lines: io.StringIO) -> None:
    """The log's JSON keeps the text as written, and a terminal that shows the log (`up`'s
    stderr) gets no control character to act on: DEL and C1 (CSI as one character), which
    orjson writes raw, are escaped as JSON escapes C0; so are the characters that fool the
    eye (a right-to-left override, a zero-width space: bot.unseen.UNSEEN). Here a key of a
    pushed config, which the refusal's line names."""
    office = resources.files("bot").joinpath("example_office.yml").read_text()
    embedded.forge.put_file("acme/.github", "vaultmail.yml",
                            office + '"evil\\x7f\\x9b2J\\u202egnp\\u200b": 1\n',
                            pusher="admin")
    await embedded.settle()
    text = log_lines.getvalue()
    assert [line for line in text.splitlines() if "evil" in line], "the refusal is logged"
    assert not [c for c in text if c in "\x7f\u202e\u200b" or "\x80" <= c <= "\x9f"], \
        [line for line in text.splitlines() if "evil" in line]
    [refused] = [x for x in _parsed(log_lines) if x["msg"].startswith("office config refused")]
    assert any("evil\x7f\x9b2J\u202egnp\u200b" in e for e in refused["errors"]), \
        refused["errors"]


def _records() -> list[logging.LogRecord]:
    """Records of every kind the app logs: plain, with `%` arguments, with extras (one that
    names a field the context binds too), text that needs escaping, each level, one with an
    exception, one with a stack."""
    def record(level: int, msg: str, args: tuple[Any, ...] = (), exc: Any = None,
               **extra: Any) -> logging.LogRecord:
        r = logging.getLogger("vaultmail.test").makeRecord(
            "vaultmail.test", level, "(unknown file)", 0, msg, args, exc, extra=extra)
        return r
    try:
        raise ValueError("boom\x1b[2J")
    except ValueError:
        exc = sys.exc_info()
    stacked = record(logging.INFO, "with a stack")
    stacked.stack_info = "Stack (most recent call last):\n  here"
    return [
        record(logging.INFO, "handled"),
        record(logging.INFO, "webhook accepted", delivery_id="d-1", installation_id=7,
               event="issues", action="opened"),
        record(logging.WARNING, "put off %.0f s: %s", (3.4, "budget"), issue="acme/v#1"),
        record(logging.DEBUG, "ignored \x7f\u202e\u200b \u00e9", reason="own\x9b"),
        record(logging.ERROR, "dead letter: %s", ("x",), exc=exc, delivery_id="d-2"),
        record(logging.CRITICAL, "stop", level_of="x", when=Path("/tmp")),
        stacked,
    ]


def test_a_line_is_the_one_structlogs_chain_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The formatter writes the app's lines itself, without structlog's copy of each record
    and chain of calls (bench.probot_compare's CPU): every record gives the very line that
    chain gives (the same keys in the same order, the same escapes, the same time), the
    context's fields with it; exceptions and stacks still go through the chain."""
    import structlog

    from bot.app import logs
    from bot.app.logs import delivery_context

    ours = logs._formatter()
    chain = structlog.stdlib.ProcessorFormatter(foreign_pre_chain=ours.foreign_pre_chain,
                                                processors=ours.processors)
    for now in (1733580000.25, 1733580000.9999, 1733580001.0):
        monkeypatch.setattr(logs.time, "time", lambda now=now: now)
        for r in _records():
            assert ours.format(r) == chain.format(r)
            with delivery_context(delivery_id="d-9", installation_id=42, event="issues",
                                  level="bound"):
                line = ours.format(r)
                assert line == chain.format(r)
                assert json.loads(line)["delivery_id"] in ("d-9", r.__dict__.get("delivery_id"))
