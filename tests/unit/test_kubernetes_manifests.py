"""The Kustomize base of an engine gated on warmth (``config/kubernetes/engine-gate``): every
object valid against the Kubernetes API schemas (``kubernetes-validate``, offline), the pod's
readiness on the ``prewarm gate`` sidecar's ``/ready``, and its settings a gated fleet."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tasks.settings import load_settings

BASE = Path(__file__).resolve().parents[2] / "config" / "kubernetes" / "engine-gate"
#: the Kubernetes version the manifests are checked against
K8S_VERSION = "1.31.0"


def _documents() -> list[dict[str, Any]]:
    """The base's objects: rendered by ``kubectl kustomize`` where it is installed, else its
    resources as written (the config map generated here from its file)."""
    kubectl = shutil.which("kubectl")
    if kubectl:
        rendered = subprocess.run([kubectl, "kustomize", str(BASE)], capture_output=True,
                                  text=True, check=True).stdout  # fmt: skip
        return [d for d in yaml.safe_load_all(rendered) if d]
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    docs = [d for name in kustomization["resources"]
            for d in yaml.safe_load_all((BASE / name).read_text()) if d]  # fmt: skip
    for generated in kustomization.get("configMapGenerator", ()):
        data = {f: (BASE / f).read_text() for f in generated["files"]}
        docs.append({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": generated["name"]}, "data": data})  # fmt: skip
    return docs


def _one(kind: str) -> dict[str, Any]:
    (doc,) = [d for d in _documents() if d["kind"] == kind]
    return doc


@pytest.mark.parametrize("doc", _documents(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_every_object_is_valid_against_the_api_schemas(doc):
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_pod_is_ready_only_when_the_gate_sidecar_says_so():
    pod = _one("Deployment")["spec"]["template"]["spec"]
    (gate,) = [c for c in pod["containers"] if c["name"] == "prewarm-gate"]
    assert gate["command"][:2] == ["prewarm", "gate"]
    port = {p["name"]: p["containerPort"] for p in gate["ports"]}
    probe = gate["readinessProbe"]
    assert probe["httpGet"]["path"] == "/ready" and probe["periodSeconds"] == 1
    assert f"--port={port[probe['httpGet']['port']]}" in gate["command"]
    (engine,) = [c for c in pod["containers"] if c["name"] == "engine"]
    assert f"--replica=http://$(POD_IP):{engine['ports'][0]['containerPort']}" in gate["command"]


def test_prewarm_finds_pods_before_they_are_ready(tmp_path):
    services = {d["metadata"]["name"]: d for d in _documents() if d["kind"] == "Service"}
    config = tmp_path / "prewarm.toml"
    config.write_text(_one("ConfigMap")["data"]["prewarm.toml"])
    (fleet,) = load_settings({}, config).fleets
    assert fleet.gate and fleet.gate_by == "readiness" and fleet.replicas_dns is not None
    found_by = services[fleet.replicas_dns.split(".")[0]]["spec"]
    assert found_by["publishNotReadyAddresses"] is True and found_by["clusterIP"] == "None"
