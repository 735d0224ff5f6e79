"""An org's office config is read at most MAX_CONFIG_BYTES (and its encoding) into the process
every office shares, however big the file its admins commit (acted out: a 32 MiB
`.github/vaultmail.yml` on Gitea was read whole, base64 in JSON, 43 MB a read, once a minute
per org, before the 2 MiB check refused it). Measured at the forge: how much of its answer
went out before the app closed the connection, never timed."""

from __future__ import annotations

from bot.app.embedded import Embedded
from bot.office.config import MAX_CONFIG_BYTES
from bot.office.source import CONFIG_PATH, CONFIG_REPO

MIB = 1024 * 1024


async def test_a_huge_config_is_refused_without_reading_it_whole(office: Embedded) -> None:
    """The forge streams the file's contents answer (as Gitea's encoder does: no
    Content-Length); the app stops reading past the limit and refuses the config naming the
    file and the limit, keeping the last valid one."""
    services, forge = office.services, office.forge
    before = await services.offices.get(services.forge_for_org("acme"), "acme", fresh=True)
    assert before is not None
    line = "# " + "x" * 1021 + "\n"  # (a comment: YAML that is only over the size limit)
    forge.put_file(f"acme/{CONFIG_REPO}", CONFIG_PATH, line * (32 * MIB // len(line)))

    after = await services.offices.get(services.forge_for_org("acme"), "acme", fresh=True)

    [answer] = forge.streamed
    await answer.ended.wait()  # the forge's side of the connection has ended too
    assert not answer.whole and answer.sent < answer.size // 2, (answer.sent, answer.size)
    assert after is before, "the last valid config stays in force"
    [error] = services.offices.last_error["acme"].errors
    assert f"acme/{CONFIG_REPO}/{CONFIG_PATH}" in error, error
    assert f"more than {MAX_CONFIG_BYTES:,} bytes (2 MiB)" in error, error
