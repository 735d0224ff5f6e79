"""The container an operator deploys: the Dockerfile and compose.yaml hold to the rules a
linter (hadolint) and `docker compose config` would check, and, where a Docker daemon answers,
the image builds and runs healthy."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in (ROOT / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pending = f"{pending} {line[:-1].strip()}" if line.endswith("\\") else f"{pending} {line}"
        if line.endswith("\\"):
            continue
        word, _, rest = pending.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        pending = ""
    return out


def test_dockerfile_is_slim_pinned_non_root_with_data_volume_and_health_check() -> None:
    ins = _instructions()
    names = [name for name, _ in ins]
    base = dict(ins)["FROM"]
    assert "slim" in base and ":" in base and not base.endswith(":latest"), \
        "a slim base image, pinned to a tag (hadolint DL3006/DL3007)"
    users = [arg for name, arg in ins if name == "USER"]
    assert users and users[-1] not in ("root", "0"), "runs as a non-root user (DL3002)"
    assert names.index("USER") < names.index("ENTRYPOINT")
    assert json.loads(dict(ins)["VOLUME"]) == ["/data"]
    env = " ".join(arg for name, arg in ins if name == "ENV")
    assert "VAULTMAIL_DATA=/data" in env
    health = dict(ins)["HEALTHCHECK"]
    assert "/healthz" in health and "--interval" in health
    for name, arg in ins:
        if name == "RUN" and "pip install" in arg:
            assert "--no-cache-dir" in arg, "pip keeps no cache in the image (DL3042)"
        if name in ("ENTRYPOINT", "CMD"):
            assert isinstance(json.loads(arg), list), \
                f"{name} in exec form, so SIGTERM reaches vaultmail (DL3025)"
        assert name != "ADD", "COPY, not ADD (DL3020)"
    copied = {shlex.split(arg)[0] for name, arg in ins if name == "COPY"}
    for package in ("bot", "handlers", "labels", "localforge"):
        assert package in copied, f"the image holds the {package} package"


def test_compose_runs_vaultmail_up_with_its_data_in_a_volume() -> None:
    spec = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert set(spec) <= {"services", "volumes", "networks", "configs", "secrets", "name"}
    service = spec["services"]["vaultmail"]
    assert service["build"] == "."
    command = service["command"]
    assert command[0] == "up" and command[command.index("--data") + 1] == "/data"
    assert "--host" in command and command[command.index("--host") + 1] == "0.0.0.0"
    volume, _, target = service["volumes"][0].partition(":")
    assert target == "/data" and volume in spec["volumes"]
    for mapping in service["ports"]:
        assert mapping.startswith("127.0.0.1:"), "published on loopback only by default"


def _docker_answers() -> bool:
    docker = shutil.which("docker")
    if docker is None:
        return False
    return subprocess.run([docker, "info"], capture_output=True, timeout=30).returncode == 0


def test_the_image_builds_and_its_command_runs_where_docker_answers() -> None:
    if not _docker_answers():
        # no daemon here (CI's machines have the client only): the two tests above are the check
        assert (ROOT / ".dockerignore").read_text().count(".venv") == 1
        return
    tag = "vaultmail:test"
    subprocess.run(["docker", "build", "-t", tag, str(ROOT)], check=True, timeout=900)
    out = subprocess.run(["docker", "run", "--rm", tag, "--version"], check=True,
                         capture_output=True, text=True, timeout=120).stdout
    assert out.startswith("vaultmail ")
