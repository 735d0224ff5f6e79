"""A config from an org's repository is data, not code (issue 21): one deployment serves many
orgs, each writing its own `.github/vaultmail.yml`, so none of them may name a program for the
app's host to run. Commands are the operator's: `--office FILE` / VAULTMAIL_OFFICE, or
VAULTMAIL_AGENT_COMMANDS naming which agent of which org runs what (`dispatch: command`). A
command runs with an environment built from an allow-list, in a directory of its own."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from pydantic import ValidationError

from bot.app.embedded import Embedded, start_embedded
from bot.app.runs import RUN_TOKEN_MARGIN
from bot.app.settings import Settings, SettingsError
from bot.names import Behalf
from bot.office.config import (
    PYTHON,
    AgentCommands,
    CommandDispatch,
    Office,
    OfficeConfigError,
    RunConfig,
    parse_office,
)
from bot.store import api_tokens, installations, ledger, mails
from tests.support import Actor, ToolClient
from tests.test_outbound_addresses import take_globex_over

MARCO = "human:marco@acme.com"
CONFIG = "acme/.github/vaultmail.yml"


def _example() -> str:
    return (Path(__file__).resolve().parents[1] / "bot" / "example_office.yml").read_text()


def _with_dispatch(text: str, dispatch: dict[str, Any]) -> str:
    """The office with each agent named in `dispatch` dispatched so (slug -> dispatch)."""
    office = yaml.safe_load(text)
    for agent in office["agents"]:
        if agent["slug"] in dispatch:
            agent["run"]["dispatch"] = dispatch[agent["slug"]]
    return yaml.safe_dump(office, sort_keys=False)


# -- a repository config names no command ------------------------------------------------------

def test_a_repository_config_naming_a_command_is_refused_where_it_does() -> None:
    text = _with_dispatch(_example(), {"echo": {"command": ["sh", "-c", "id"]}})
    with pytest.raises(OfficeConfigError) as caught:
        parse_office(text, CONFIG, repository=True)
    [error] = caught.value.errors
    assert error.startswith(f"{CONFIG}: agents[3].run.dispatch: "), error
    assert "operator" in error and "VAULTMAIL_AGENT_COMMANDS" in error, error
    assert "dispatch: command" in error, "it says what to write instead"
    # even a command that would not parse is refused for what it is
    broken = _with_dispatch(_example(), {"scout": {"command": []}})
    with pytest.raises(OfficeConfigError) as caught:
        parse_office(broken, CONFIG, repository=True)
    assert any(e.startswith(f"{CONFIG}: agents[0].run.dispatch: ") and "operator" in e
               for e in caught.value.errors), caught.value.errors
    # the operator's own file may name one; `dispatch: command` is fine from anywhere
    own = parse_office(text, "office.yml", repository=False).agent("echo")
    assert own is not None and isinstance(own.run.dispatch, CommandDispatch)
    asked = parse_office(_example(), CONFIG, repository=True).agent("echo")
    assert asked is not None and asked.run.dispatch == "command"


def test_reading_a_config_as_the_operators_is_said_never_assumed() -> None:
    """Where a config came from is said by every caller: a parse that forgets to say, or a
    validation given no context, reads it as an org's (no command), never as the operator's."""
    text = _with_dispatch(_example(), {"echo": {"command": ["sh", "-c", "id"]}})
    with pytest.raises(TypeError):
        parse_office(text, CONFIG)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="cannot name a command"):
        Office.model_validate(yaml.safe_load(text))
    with pytest.raises(ValidationError, match="cannot name a command"):
        RunConfig(dispatch=CommandDispatch(command=["sh", "-c", "id"]))
    own = Office.model_validate(yaml.safe_load(text), context={"repository": False})
    assert isinstance(own.agent("echo").run.dispatch, CommandDispatch)  # type: ignore[union-attr]


async def test_a_pushed_config_naming_a_command_is_refused_and_nothing_runs(
        embedded: Embedded, person: Any, tools: Any, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    evil = _with_dispatch(_example(), {"echo": {"command": [
        PYTHON, "-c", f"open({str(marker)!r}, 'w').write('ran'); import sys; sys.stdin.read()"]}})
    embedded.forge.put_file("acme/.github", "vaultmail.yml", evil, pusher="admin")
    await embedded.settle()
    [issue] = await person("admin").issues("acme/.github")
    assert issue["title"] == "vaultmail.yml was refused"
    assert f"{CONFIG}: agents[3].run.dispatch: " in issue["body"], issue["body"]
    assert "VAULTMAIL_AGENT_COMMANDS" in issue["body"]
    [refused] = await embedded.ledger_events("office.config_refused")
    assert any("agents[3].run.dispatch" in e for e in refused.data["errors"])
    # the last valid config stays: echo runs the operator's program, never the pushed one
    sent = (await tools(MARCO)("mail_send", to="echo", subject="Who runs?", body="hi"))["mail"]
    await embedded.settle()
    [finished] = [e for e in await embedded.ledger_events("run.finished")
                  if e.subject == sent["ref"]]
    assert finished.data["exit"] == 0 and finished.data["command"][1:] == [
        "-m", "bot.agents.echo"], finished.data
    assert not marker.exists(), "the command a repository named never ran"


# -- the operator's commands -------------------------------------------------------------------

async def test_dispatch_command_runs_what_the_operator_set_and_nothing_else(
        tmp_path: Path) -> None:
    """scout's program is the operator's (VAULTMAIL_AGENT_COMMANDS, here given directly);
    builder asks for one the operator never set: its run fails, saying where to set it."""
    office = tmp_path / "office.yml"
    office.write_text(_with_dispatch(_example(), {"scout": "command", "builder": "command"}))
    granted = AgentCommands({"ACME": {"scout": CommandDispatch(
        command=[PYTHON, "-c", "import sys; sys.stdin.read(); print('the operator set me')"])}})
    emb = await start_embedded(office_path=office, data_dir=tmp_path / "d", port=0,
                               forge_port=0, agent_commands=granted)
    try:
        async with aiohttp.ClientSession() as session:
            marco = ToolClient(session, emb, MARCO)
            to_scout = (await marco("mail_send", to="scout", subject="A", body="x"))["mail"]
            to_builder = (await marco("mail_send", to="builder", subject="B", body="y"))["mail"]
        await emb.settle()
        done = {e.subject: e.data for e in await emb.ledger_events("run.finished")}
        assert done[to_scout["ref"]]["exit"] == 0, done
        assert "the operator set me" in done[to_scout["ref"]]["stdout"]
        refused = done[to_builder["ref"]]
        assert refused["exit"] is None and refused["refused"] is True, refused
        assert "acme's agent builder" in refused["error"]
        assert "VAULTMAIL_AGENT_COMMANDS" in refused["error"], refused["error"]
        [run] = await mails.runs_for(emb.services.store, "builder", org="acme")
        assert run["state"] == "failed"
    finally:
        await emb.stop()


GLOBEX: dict[str, Any] = {
    "org": "globex",
    "humans": [{"email": "hank@globex.com", "login": "hank", "permissions": ["mail.send"]}],
    "agents": [{"slug": "scout", "login": "globex-scout", "person": "hank@globex.com",
                "run": {"triggers": ["mail"], "dispatch": "command"}}],
}
SQUATTER: dict[str, Any] = {
    "org": "globex",
    "humans": [{"email": "eve@evil.test", "login": "eve", "permissions": ["mail.send"]}],
    "agents": [{"slug": "scout", "login": "evil-scout", "person": "eve@evil.test",
                "run": {"triggers": ["mail"], "dispatch": "command"}}],
}


async def _send(emb: Embedded, principal: str, org: str) -> str:
    """A mail to scout from `principal` of `org`'s office: its ref."""
    token = await api_tokens.create_token(emb.services.store, principal, org)
    async with aiohttp.ClientSession() as session, session.post(
            emb.app_url + "/api/v1/tools/mail_send", headers={"Authorization": f"Bearer {token}"},
            json={"to": "scout", "subject": "Go", "body": "run"}) as resp:
        assert resp.status == 200, await resp.text()
        return str((await resp.json())["mail"]["ref"])


async def test_a_command_by_login_does_not_run_while_the_orgs_account_is_not_known(
        tmp_path: Path, database_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """The operator sets scout's program for acme by its login alone (`acme:`). While the
    index does not know acme's forge account (an index from before it read ids, a forge that
    gave none: it cannot tell whose acme is), the command does not run: refused as one with
    no command set, failing closed (the operator told); once the account is known, it runs.
    Before, an unknown account was taken as the login's: the entries applied to whoever held
    it."""
    import logging

    caplog.set_level(logging.WARNING)
    office = tmp_path / "office.yml"
    office.write_text(_with_dispatch(_example(), {"scout": "command"}))
    granted = AgentCommands({"acme": {"scout": CommandDispatch(
        command=[PYTHON, "-c", "import sys; sys.stdin.read(); print('the operator set me')"])}})
    emb = await start_embedded(office_path=office, data_dir=tmp_path / "d", port=0,
                               forge_port=0, database_url=database_url, agent_commands=granted)
    try:
        store = emb.services.store
        account = await installations.account_of(store, "acme")
        assert account is not None
        async with store.transaction() as db:  # (as an index that has not read the id yet)
            await db.execute("UPDATE installations SET account_id=NULL WHERE org='acme'")
        async with aiohttp.ClientSession() as session:
            marco = ToolClient(session, emb, MARCO)
            unknown = (await marco("mail_send", to="scout", subject="A", body="x"))["mail"]
            await emb.settle()
            async with store.transaction() as db:  # the listing reads it
                await db.execute("UPDATE installations SET account_id=? WHERE org='acme'",
                                 (account,))
            known = (await marco("mail_send", to="scout", subject="B", body="y"))["mail"]
        await emb.settle()
        done = {e.subject: e.data for e in await emb.ledger_events("run.finished")}
        refused = done[unknown["ref"]]
        assert refused["exit"] is None and refused["refused"] is True, refused
        assert refused["error"].startswith("no command is set for acme's agent scout"), refused
        assert done[known["ref"]]["exit"] == 0, done
        assert "the operator set me" in done[known["ref"]]["stdout"]
        [warned] = [r.getMessage() for r in caplog.records
                    if "not applied while the forge has not said" in r.getMessage()]
        assert "VAULTMAIL_AGENT_COMMANDS: " in warned and "scout" in warned, warned
        assert "acme#ID" in warned, warned
    finally:
        await emb.stop()


async def test_a_command_for_an_org_does_not_run_for_the_next_owner_of_its_login(
        tmp_path: Path, database_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """The operator sets a program for globex's scout (`globex:` in VAULTMAIL_AGENT_COMMANDS,
    the org by its login). globex is deleted, and another account makes an org called globex,
    installs the App and writes a config whose scout says `dispatch: command`. The command is
    bound to the account first recorded as globex: the new owner's run is refused as one with no
    command set (failed, `run.finished` saying so), nothing runs on the app's host, and the
    operator is told what to write. Before, the command went with the login: whoever took it
    had the app run, on its host, the program the operator set for the org that had it."""
    import logging

    from bot.office.seed import seed_office

    caplog.set_level(logging.WARNING)
    ran = tmp_path / "ran"
    granted = AgentCommands({"globex": {"scout": CommandDispatch(command=[
        PYTHON, "-c", f"import sys; open({str(ran)!r}, 'a').write(sys.stdin.read() + '\\n')"])}})
    emb = await start_embedded(data_dir=tmp_path / "d", port=0, forge_port=0,
                               database_url=database_url, agent_commands=granted)
    try:
        forge = emb.forge
        seed_office(forge, parse_office(yaml.safe_dump(GLOBEX), "globex.yml", repository=False))
        (app_id,) = forge.state.apps
        first = forge.install_app(int(app_id), "globex")
        await emb.settle()
        hanks = await _send(emb, "human:hank@globex.com", "globex")
        await emb.settle()
        [done] = [e for e in await ledger.entries(emb.services.store, org="globex")
                  if e.event == "run.finished"]
        assert done.subject == hanks and done.data["exit"] == 0, done.data
        assert len(ran.read_text().splitlines()) == 1, "the org's own run ran its command"

        # the login is another account's now, with its own config asking for the command
        await take_globex_over(emb, first, app_id)
        forge.put_file("globex/.github", "vaultmail.yml", yaml.safe_dump(SQUATTER),
                       pusher="eve")
        await emb.settle()
        eves = await _send(emb, "human:eve@evil.test", "globex")
        await emb.settle()

        assert len(ran.read_text().splitlines()) == 1, "the new owner's run ran the command"
        [refused] = [e for e in await ledger.entries(emb.services.store, org="globex")
                     if e.event == "run.finished"]
        assert refused.subject == eves, refused
        assert refused.data["exit"] is None and refused.data["refused"] is True, refused.data
        # worded as for an office with no command set: it is not told what another had
        assert refused.data["error"].startswith(
            "no command is set for globex's agent scout"), refused.data["error"]
        [run] = await mails.runs_for(emb.services.store, "scout", org="globex")
        assert run["state"] == "failed"
        [warned] = {r.getMessage(): r for r in caplog.records
                    if "VAULTMAIL_AGENT_COMMANDS" in r.getMessage()}.values()
        new = forge.state.accounts["globex"].id
        message = warned.getMessage()
        assert "globex (scout)" in message and f"globex#{new}" in message, message
        assert warned.__dict__["agents"] == ["scout"] and warned.__dict__["account"] == new
    finally:
        await emb.stop()


async def test_a_command_is_the_account_first_installed_under_the_login_not_first_run(
        tmp_path: Path, database_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """The operator sets a program for globex's scout (`globex:`), and globex installs the
    App but writes no config: nothing of the operator's for it is used yet. globex is
    deleted, and another account makes an org called globex, installs the App and asks for
    the command. The command is the account the index recorded under globex first (when its
    installation was heard), not the one whose run first asks: the new owner's run is refused
    as one with no command set, nothing runs, and the operator is told. Before, it was bound
    at its first use: the newcomer's run, which got the program."""
    import logging

    caplog.set_level(logging.WARNING)
    ran = tmp_path / "ran"
    granted = AgentCommands({"globex": {"scout": CommandDispatch(command=[
        PYTHON, "-c", f"import sys; open({str(ran)!r}, 'a').write(sys.stdin.read() + '\\n')"])}})
    emb = await start_embedded(data_dir=tmp_path / "d", port=0, forge_port=0,
                               database_url=database_url, agent_commands=granted)
    try:
        forge = emb.forge
        forge.add_org("globex")  # (no config: the operator's entries are not used for it)
        for repo in (".github", "scout-vault"):
            forge.add_repo("globex", repo)
        (app_id,) = forge.state.apps
        first = forge.install_app(int(app_id), "globex")
        await emb.settle()
        old = forge.state.accounts["globex"].id

        await take_globex_over(emb, first, app_id)
        forge.put_file("globex/.github", "vaultmail.yml", yaml.safe_dump(SQUATTER),
                       pusher="eve")
        await emb.settle()
        eves = await _send(emb, "human:eve@evil.test", "globex")
        await emb.settle()

        assert not ran.exists(), "the new owner's run ran the command"
        [refused] = [e for e in await ledger.entries(emb.services.store, org="globex")
                     if e.event == "run.finished"]
        assert refused.subject == eves and refused.data["refused"] is True, refused.data
        [warned] = {r.getMessage(): r for r in caplog.records
                    if "VAULTMAIL_AGENT_COMMANDS" in r.getMessage()}.values()
        assert warned.__dict__["bound_account"] == old, warned.__dict__
        assert warned.__dict__["account"] == forge.state.accounts["globex"].id != old
    finally:
        await emb.stop()


ENV_SCRIPT = ("import json, os, sys; sys.stdin.read(); open('left-behind', 'w').close(); "
              "print(json.dumps({'keys': sorted(os.environ), 'cwd': os.getcwd(), "
              "'lang': os.environ.get('LANG'), 'tz': os.environ.get('TZ')}))")
APP_SECRETS = {"PRIVATE_KEY": "-----BEGIN PRIVATE KEY-----leak", "WEBHOOK_SECRET": "leak",
               "APP_ID": "42", "DATABASE_URL": "postgresql://app:pw@db/vaultmail",
               "GITHUB_TOKEN": "ghp_leak", "GITHUB_WEBHOOK_SECRET": "leak",
               "GITHUB_CLIENT_SECRET": "leak", "GITEA_TOKEN": "leak", "VAULTMAIL_DATA": "/srv",
               "AWS_SECRET_ACCESS_KEY": "leak"}
ALLOWED = {"PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "PYTHONPATH",
           "VAULTMAIL_APP_URL", "VAULTMAIL_TOKEN", "VAULTMAIL_AGENT", "VAULTMAIL_RUN"}


async def test_a_command_gets_none_of_the_apps_settings_and_a_directory_of_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {**APP_SECRETS, "LANG": "C.UTF-8", "TZ": "Europe/Rome",
                        "LC_TIME": "C"}.items():
        monkeypatch.setenv(name, value)
    office = tmp_path / "office.yml"  # the operator's own file: it may name a command
    office.write_text(_with_dispatch(_example(), {
        "scout": {"command": [PYTHON, "-c", ENV_SCRIPT], "timeout": 60}}))
    data = tmp_path / "d"
    emb = await start_embedded(office_path=office, data_dir=data, port=0, forge_port=0)
    try:
        async with aiohttp.ClientSession() as session:
            sent = (await ToolClient(session, emb, MARCO)(
                "mail_send", to="scout", subject="Env", body="what do you see?"))["mail"]
            # the forge holds the config as an org would write it: no program in it
            stored = await Actor(session, emb, "admin").call(
                "GET", "/repos/acme/.github/contents/vaultmail.yml", expect=200)
        await emb.settle()
        [finished] = await emb.ledger_events("run.finished")
        assert finished.subject == sent["ref"] and finished.data["exit"] == 0, finished.data
        seen = json.loads(finished.data["stdout"])
        keys = set(seen["keys"])
        assert not keys & set(APP_SECRETS), f"the app's settings reached it: {keys}"
        assert not {k for k in keys if k.startswith(("GITHUB_", "GITEA_"))}, keys
        assert keys <= ALLOWED | {k for k in keys if k.startswith("LC_")}, keys - ALLOWED
        assert {"PATH", "VAULTMAIL_TOKEN", "VAULTMAIL_APP_URL", "LC_TIME"} <= keys
        assert (seen["lang"], seen["tz"]) == ("C.UTF-8", "Europe/Rome")
        cwd = Path(seen["cwd"]).resolve()
        assert cwd != data.resolve() and data.resolve() not in cwd.parents, cwd
        assert not cwd.exists(), "its directory is removed when the run ends"
        assert not list(data.rglob("left-behind"))
        text = base64.b64decode(stored["content"]).decode()
        assert "dispatch: command" in text and ENV_SCRIPT not in text
        # the run's token acts for its time and a margin, whatever becomes of its revocation
        # (the app killed mid-run, the command left running: it acted for good; review)
        [row] = await emb.services.store.fetchall(
            "SELECT created_at, expires_at, revoked_at FROM api_tokens WHERE principal=?"
            " AND expires_at IS NOT NULL", ("agent:scout",))
        assert row["expires_at"] - row["created_at"] == pytest.approx(60 + RUN_TOKEN_MARGIN)
        assert row["revoked_at"] is not None
        spent = await api_tokens.create_token(emb.services.store, "agent:scout", "acme",
                                              lasts=0.0)
        async with aiohttp.ClientSession() as session:
            status, _ = await ToolClient(session, emb, MARCO).raw("list_inbox", {},
                                                                  token=spent)
        assert status == 401
    finally:
        await emb.stop()


# -- the settings ------------------------------------------------------------------------------

GITEA = {"GITEA_URL": "http://gitea.test", "GITEA_TOKEN": "t", "GITEA_WEBHOOK_SECRET": "s"}


def test_the_command_setting_names_programs_per_org_and_agent(tmp_path: Path) -> None:
    commands = tmp_path / "commands.yml"
    commands.write_text('acme:\n  echo:\n    command: ["{python}", "-m", "bot.agents.echo"]\n'
                        "    timeout: 30\n")
    settings = Settings.from_env({**GITEA, "VAULTMAIL_AGENT_COMMANDS": str(commands)})
    echo = settings.agent_commands.command_for(Behalf("Acme"), "echo")
    assert echo is not None and echo.command[0] == PYTHON and echo.timeout == 30
    assert settings.agent_commands.command_for(Behalf("globex"), "echo") is None
    assert Settings.from_env(GITEA).agent_commands.command_for(Behalf("acme"), "echo") is None
    commands.write_text("acme:\n  echo:\n    command: []\n  Echo!: {command: [x]}\n")
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({**GITEA, "VAULTMAIL_AGENT_COMMANDS": str(commands)})
    message = str(caught.value)
    assert message.startswith(f"VAULTMAIL_AGENT_COMMANDS={str(commands)!r}: "), message
    assert "acme.echo.command" in message and "at least 1" in message, message
    with pytest.raises(SettingsError, match="cannot be read"):
        Settings.from_env({**GITEA, "VAULTMAIL_AGENT_COMMANDS": str(tmp_path / "none.yml")})



def test_a_command_may_name_the_account_its_org_is(tmp_path: Path) -> None:
    """`acme#1234:` is for the office whose forge account is 1234, under the login acme;
    `acme:` for the account the login's entries are bound to (Behalf.by_login),
    which the operator's outbound entries share. Any other holder of the login runs none."""
    commands = tmp_path / "commands.yml"
    commands.write_text('acme:\n  echo: {command: [by-login]}\n  scout: {command: [scout]}\n'
                        'ACME#1234:\n  echo: {command: [by-account]}\n'
                        'acme#77:\n  builder: {command: [seventy-seven]}\n')
    granted = Settings.from_env({**GITEA, "VAULTMAIL_AGENT_COMMANDS": str(commands)}
                                ).agent_commands
    acme, other = Behalf("acme", 1234, by_login=True), Behalf("acme", 99, by_login=False)

    def program(office: Behalf, slug: str) -> str | None:
        found = granted.command_for(office, slug)
        return None if found is None else found.command[0]

    assert program(acme, "echo") == "by-account", "the account named comes first"
    assert program(acme, "scout") == "scout" and program(acme, "builder") is None
    assert program(Behalf("acme", 1234, by_login=False), "echo") == "by-account"
    assert program(Behalf("acme", 1234, by_login=False), "scout") is None
    assert program(other, "echo") is None and program(other, "scout") is None
    assert program(Behalf("acme", 99, by_login=True), "echo") == "by-login"
    assert program(Behalf("acme", 77, by_login=False), "builder") == "seventy-seven"
    # an account not known is not the one named; the login's entries apply (nothing to
    # tell its owners apart by)
    unknown = Behalf("acme", None, by_login=True)
    assert program(unknown, "builder") is None and program(unknown, "echo") == "by-login"
    assert granted.by_login("ACME") == ["echo", "scout"] and granted.by_login("globex") == []
    for wrong in ("acme#", "acme#x", "acme#0", "#12", "acme#-1", "acme#1#2", "acme#１",
                  "Acme Corp"):
        commands.write_text(f"{wrong!r}:\n  echo: {{command: [x]}}\n")
        with pytest.raises(SettingsError) as caught:
            Settings.from_env({**GITEA, "VAULTMAIL_AGENT_COMMANDS": str(commands)})
        assert f"{wrong}: not an org" in str(caught.value) and "acme#1234" in str(
            caught.value), str(caught.value)


# -- one org's file, one org's problem ---------------------------------------------------------

@pytest.mark.parametrize("pattern", [
    "{slug}{0}", "{slug:>20000000}", "{slug}{slug:>20000000}", "{slug.__class__}", "{slug}/x",
    "vault", "{slug}-{slug}", "../{slug}"])
def test_a_vault_pattern_is_a_repository_name_never_a_format_string(pattern: str) -> None:
    """`vault_pattern` is filled by replacing {slug}: an index, a width or an attribute in
    an org's file would be work (or an error) of the host's, for every office's events."""
    office = yaml.safe_load(_example())
    office["vault_pattern"] = pattern
    office["agents"] = [{k: v for k, v in a.items() if k != "vault"} for a in office["agents"]]
    with pytest.raises(OfficeConfigError) as caught:
        parse_office(yaml.safe_dump(office), CONFIG, repository=True)
    assert any("vault_pattern" in e and "{slug}" in e for e in caught.value.errors), (
        caught.value.errors)


def test_a_vault_pattern_names_each_agents_vault() -> None:
    office = yaml.safe_load(_example())
    office["vault_pattern"] = "vault.{slug}_x"
    office["agents"] = [{k: v for k, v in a.items() if k != "vault"} for a in office["agents"]]
    parsed = parse_office(yaml.safe_dump(office), CONFIG, repository=True)
    assert [parsed.vault_of(a) for a in parsed.agents][:2] == [
        "acme/vault.scout_x", "acme/vault.builder_x"]


EVIL_OFFICE = {"org": "evil", "humans": [{"email": "eve@evil.test", "login": "eve",
                                          "permissions": ["mail.send"]}],
               "agents": [{"slug": "spy", "login": "evil-spy"}]}


@pytest.mark.parametrize("poison", [
    b"org: evil\n# \xff\n",  # not UTF-8
    b"org: evil\nvault_pattern: '{slug}{0}'\nagents: [{slug: spy, login: evil-spy}]\n",
], ids=["not-utf-8", "format-string"])
async def test_an_orgs_unreadable_config_stops_no_round_of_every_office(
        embedded: Embedded, poison: bytes) -> None:
    """evil pushes a config that cannot be read: evil's last valid config stays, and the
    rounds over every office (sign-in, org-less tokens, outbound webhooks) go on for acme."""
    from bot.app.outbound import LedgerForwarder
    from bot.console.signin import offices_of_login
    from bot.office.seed import seed_office
    from bot.tools.http import office_org

    services = embedded.services
    seed_office(embedded.forge, parse_office(yaml.safe_dump(EVIL_OFFICE), "evil.yml",
                                             repository=False))
    (app_id,) = embedded.forge.state.apps
    installation = embedded.forge.install_app(int(app_id), "evil")
    # installed as the installation webhook records it: in the index, which every replica
    # serves (Services.follow_index), then in this replica's memory
    await installations.installed(services.store, "evil", installation)
    services.installations["evil"] = installation
    assert await services.offices.get(services.forge_for_org("evil"), "evil") is not None
    embedded.forge.state.repo_by_full_name("evil/.github").write_file("vaultmail.yml", poison)
    services.offices.max_age = 0  # (its 60 s cache has run out)
    assert await offices_of_login(services, "marco") == [(MARCO, "acme")]
    assert await office_org(services, MARCO) == "acme"
    await LedgerForwarder(services)._round()
    kept = await services.offices.get(services.forge_for_org("evil"), "evil")
    assert kept is not None and kept.agent("spy") is not None  # the last valid one
    assert "evil" in services.offices.last_error
