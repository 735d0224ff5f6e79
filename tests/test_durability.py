"""What a 2xx promises on SQLite is chosen, not stated (issue 29): `normal` (the default)
survives a process crash, `full` a power cut too; the operator sets it."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.app.settings import Settings, SettingsError
from bot.store import open_store

ENV = {"GITHUB_APP_ID": "7", "GITHUB_WEBHOOK_SECRET": "s",
       "PRIVATE_KEY": "-----BEGIN PRIVATE KEY-----\\nx\\n-----END PRIVATE KEY-----"}


@pytest.mark.parametrize(("chosen", "pragma"), [("normal", 1), ("full", 2)])
async def test_the_index_commits_as_durably_as_the_operator_chose(
        tmp_path: Path, chosen: str, pragma: int) -> None:
    settings = Settings.from_env(env={**ENV, "VAULTMAIL_SQLITE_SYNCHRONOUS": chosen})
    assert settings.sqlite_synchronous == chosen
    store = await open_store(tmp_path / "index.sqlite3", synchronous=settings.sqlite_synchronous)
    try:
        row = await store.fetchone("PRAGMA synchronous")
        assert row is not None and row[0] == pragma
    finally:
        await store.close()


def test_a_durability_that_is_neither_says_what_it_takes() -> None:
    with pytest.raises(SettingsError, match="VAULTMAIL_SQLITE_SYNCHRONOUS.*normal or full"):
        Settings.from_env(env={**ENV, "VAULTMAIL_SQLITE_SYNCHRONOUS": "extra"})
