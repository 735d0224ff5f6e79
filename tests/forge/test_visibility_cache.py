"""The forge's answers about who may see a repository are kept per office: one office asking
about many logins or repositories pushes out none of another office's answers (before, the
whole cache was flushed when it filled, and every office asked the forge again, on its own
installation's rate limit)."""

from __future__ import annotations

from bot.office.visibility import Visibility
from tests.forge.conftest import Env


async def test_one_office_filling_its_answers_pushes_out_none_of_anothers(env: Env) -> None:
    env.forge.add_org("globex", owner="admin")
    env.forge.add_repo("globex", "vault")
    globex_iid = env.forge.install_app(env.app_id, "globex")
    client = env.client()
    acme, globex = client.installation(env.installation_id), client.installation(globex_iid)
    seen = Visibility(per_office=4)

    assert await seen.role(acme, "acme/vault", "marco") == "write"
    asked = len(env.records("GET", "/permission"))
    for n in range(10):  # another office's questions, more than it may keep
        assert await seen.role(globex, "globex/vault", f"someone{n}") == "none"
    assert len(env.records("GET", "/permission")) == asked + 10
    assert await seen.role(acme, "acme/vault", "marco") == "write"
    assert len(env.records("GET", "/permission")) == asked + 10, "acme's answer was kept"
    # globex keeps its own newest answers, as many as it may
    assert await seen.role(globex, "globex/vault", "someone9") == "none"
    assert len(env.records("GET", "/permission")) == asked + 10
    assert await seen.role(globex, "globex/vault", "someone0") == "none"
    assert len(env.records("GET", "/permission")) == asked + 11
