"""The Kustomize base of `vaultmail serve` on Kubernetes (deploy/kustomize, issue 23), checked
offline: every manifest against Kubernetes' own JSON schemas (kubernetes-validate bundles them,
strict: an unknown field is an error), and against the app itself: each variable the
Deployment sets is one `serve` reads (bot/app/settings.py), the settings it makes start the app
as the manifests mean (port, database, data directory, the private key's file, the operator's
token), the probes ask the app's probe routes on its port, and the container runs as the
Dockerfile's user. A renamed variable or route fails here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from pydantic import AliasChoices

from bot.app.settings import Settings, _EnvFile
from bot.app.web import ALWAYS_SERVED

ROOT = Path(__file__).parent.parent
BASE = ROOT / "deploy" / "kustomize"
KUBERNETES = "1.30.0"  # the oldest Kubernetes the base is held to (policy/v1, seccompProfile)


def _manifests() -> dict[str, list[dict[str, Any]]]:
    return {path.name: [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
            for path in sorted(BASE.glob("*.yaml")) if path.name != "kustomization.yaml"}


def _one(kind: str) -> dict[str, Any]:
    found = [doc for docs in _manifests().values() for doc in docs if doc["kind"] == kind]
    assert len(found) == 1, f"one {kind} in the base, found {len(found)}"
    return found[0]


def _container() -> dict[str, Any]:
    containers = _one("Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: dict[str, Any] = containers[0]
    return container


def test_the_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert kustomization["kind"] == "Kustomization"
    assert sorted(kustomization["resources"]) == sorted(_manifests())
    assert set(kustomization) <= {"apiVersion", "kind", "resources", "images"}
    assert [image["name"] for image in kustomization["images"]] == [_container()["image"]]


@pytest.mark.parametrize("version", [KUBERNETES, kubernetes_validate.latest_version()])
def test_every_manifest_is_valid_kubernetes(version: str) -> None:
    for name, docs in _manifests().items():
        assert docs, f"{name} holds no manifest"
        for doc in docs:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{name}: {doc['kind']} {doc['metadata']['name']} is not valid "
                            f"Kubernetes {version}: {exc.message} at "
                            f"{'.'.join(map(str, exc.path))}")


def test_the_validation_has_teeth() -> None:
    deployment = _one("Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"][
        "paht"] = "/readyz"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES, strict=True)


def _names_serve_reads() -> set[str]:
    return {str(name) for info in _EnvFile.model_fields.values()
            if isinstance(info.validation_alias, AliasChoices)
            for name in info.validation_alias.choices}


def _environment() -> dict[str, str]:
    """The container's environment as Kubernetes makes it: its ConfigMap's keys, its own
    values, a stand-in for each Secret key and the pod's name."""
    container = _container()
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        name = source["configMapRef"]["name"]
        config = _one("ConfigMap")
        assert config["metadata"]["name"] == name
        env.update(config["data"])
    for var in container["env"]:
        if "value" in var:
            env[var["name"]] = var["value"]
        elif "secretKeyRef" in var["valueFrom"]:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = {"database-url": "postgresql://vaultmail:pw@postgres/vaultmail",
                                "app-id": "123456"}.get(ref["key"], f"secret {ref['key']}")
        else:
            assert var["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
            env[var["name"]] = "vaultmail-5d9c7b7f9-abcde"
    return env


def test_every_variable_set_is_one_serve_reads() -> None:
    env = _environment()
    unknown = sorted(set(env) - _names_serve_reads())
    assert not unknown, f"serve reads no variable named {unknown} (bot/app/settings.py)"


def test_the_settings_made_from_the_manifests(tmp_path: Path) -> None:
    """`serve`'s settings from exactly this environment (the private key read from where the
    Secret is mounted): the port the probes ask, PostgreSQL for the replicas, the data
    directory on the shared volume, the Secret's values where they belong."""
    container, spec = _container(), _one("Deployment")["spec"]
    env = _environment()
    # the private key: the Secret's key mounted as the file the variable names
    key_path = Path(env["GITHUB_PRIVATE_KEY_PATH"])
    mount = next(m for m in container["volumeMounts"]
                 if Path(m["mountPath"]) == key_path.parent)
    assert mount.get("readOnly") is True
    volume = next(v for v in spec["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["secretName"] == "vaultmail"
    assert {"key": "private-key.pem", "path": key_path.name} in volume["secret"]["items"]
    pem = tmp_path / key_path.name
    pem.write_text("-----BEGIN RSA PRIVATE KEY-----\nMIIB\n-----END RSA PRIVATE KEY-----\n")
    settings = Settings.from_env({**env, "GITHUB_PRIVATE_KEY_PATH": str(pem)}, env_file=None)
    assert settings.dialect == "github" and settings.app_id == "123456"
    assert settings.webhook_secret == "secret webhook-secret"
    assert settings.operator_token == "secret operator-token"
    assert settings.client_id == "secret client-id"
    assert settings.database_url.startswith("postgresql://")  # several replicas: PostgreSQL
    assert settings.replica_id == "vaultmail-5d9c7b7f9-abcde"
    assert settings.host == "0.0.0.0"
    assert settings.public_url == "https://vaultmail.example.com"
    assert [str(n) for n in settings.trusted_proxies] == ["10.0.0.0/8"]  # the ingress's
    # the data directory (the signing keys all replicas share) is on the shared volume
    data_mount = next(m for m in container["volumeMounts"] if m["name"] == "data")
    assert settings.data_dir.is_relative_to(data_mount["mountPath"])
    assert settings.data_dir != Path(data_mount["mountPath"])  # the app narrows its own to 0700
    claim = next(v for v in spec["template"]["spec"]["volumes"] if v["name"] == "data")
    pvc = _one("PersistentVolumeClaim")
    assert claim["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert spec["replicas"] > 1
    # the port: the app's, the container's, the probes' and the Service's
    (port,) = container["ports"]
    assert port["containerPort"] == settings.port
    service = _one("Service")
    assert service["spec"]["selector"] == spec["selector"]["matchLabels"]
    assert [p["targetPort"] for p in service["spec"]["ports"]] == [port["name"]]


def test_the_probes_ask_the_apps_probe_routes() -> None:
    container = _container()
    port = container["ports"][0]["name"]
    probes = {kind: container[kind]["httpGet"]
              for kind in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert probes["readinessProbe"] == {"path": "/readyz", "port": port}
    assert probes["livenessProbe"] == {"path": "/healthz", "port": port}
    assert probes["startupProbe"] == {"path": "/healthz", "port": port}
    # served before the app has reached the forge too (bot/app/web.py)
    assert {"/readyz", "/healthz"} <= set(ALWAYS_SERVED)


def test_it_runs_as_the_images_user_on_a_read_only_root() -> None:
    pod = _one("Deployment")["spec"]["template"]["spec"]
    container = _container()
    uid = re.search(r"--uid (\d+)", (ROOT / "Dockerfile").read_text())
    assert uid is not None
    assert pod["securityContext"]["runAsUser"] == int(uid.group(1))
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    # what it writes: the data volume, and /tmp (agents' run folders) on an emptyDir
    writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert writable == {"/data", "/tmp"}
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    # the Secret's values never sit in the manifests
    for name, docs in _manifests().items():
        assert all(doc["kind"] != "Secret" for doc in docs), f"{name} holds a Secret"


def test_the_readmes_secret_has_every_key_the_deployment_reads() -> None:
    """The README's `kubectl create secret generic vaultmail` makes the keys the Deployment
    takes from the Secret, no fewer and no other."""
    readme = (ROOT / "README.md").read_text()
    command = re.search(r"kubectl create secret generic vaultmail (.*?)\n(?!\s)", readme, re.S)
    assert command, "the README says how to create the Secret"
    made = set(re.findall(r"--from-(?:literal|file)=([\w.-]+)=", command.group(1)))
    container, pod = _container(), _one("Deployment")["spec"]["template"]["spec"]
    read = {var["valueFrom"]["secretKeyRef"]["key"] for var in container["env"]
            if "secretKeyRef" in var.get("valueFrom", {})}
    read |= {item["key"] for volume in pod["volumes"] if "secret" in volume
             for item in volume["secret"]["items"]}
    assert made == read
