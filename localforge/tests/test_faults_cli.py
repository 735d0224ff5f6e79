"""Faults from the command line: `vaultmail forge --fault ... --drop-webhooks ...`."""

from __future__ import annotations

import argparse

import aiohttp
import pytest

from localforge import LocalForge
from localforge.cli import apply_fault_options, configure_parser, parse_fault, parse_lose


def test_a_bad_fault_spec_says_what_is_expected() -> None:
    with pytest.raises(ValueError, match="ROUTE=STATUS"):
        parse_fault("POST /repos/{owner}/{repo}/issues")
    assert parse_fault("GET /rate_limit=503@0.5") == ("GET /rate_limit", 503, 0.5)
    with pytest.raises(ValueError, match="ROUTE\\[@RATE\\]"):
        parse_lose("PATCH /repos/{owner}/{repo}/issues/{issue_number}@often")
    assert parse_lose("POST *@0.15") == ("POST *", 0.15)
    assert parse_lose("POST *") == ("POST *", 1.0)


async def test_command_line_faults_are_applied() -> None:
    parser = argparse.ArgumentParser()
    configure_parser(parser)
    args = parser.parse_args(["--fault", "GET /rate_limit=503", "--drop-webhooks", "0.2",
                              "--lose", "POST /repos/{owner}/{repo}/issues@0.15"])
    forge = LocalForge()
    apply_fault_options(forge, args)
    await forge.start()
    try:
        token = forge.add_user("someone")
        async with aiohttp.ClientSession() as s, s.get(
                forge.url + "/rate_limit", headers={"Authorization": f"token {token}"}) as resp:
            assert resp.status == 503
        assert forge.faults.drop.rate == 0.2
        [lose] = [f for f in forge.faults.routes if f.mode == "lost"]
        assert (lose.route, lose.rate) == ("POST /repos/{owner}/{repo}/issues", 0.15)
    finally:
        await forge.stop()
