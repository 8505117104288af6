"""The Kustomize base (config/kubernetes/prewarm/) validates offline against the Kubernetes
API schemas (kubernetes-validate), and has what running prewarm on many nodes needs: Redis,
one Deployment per worker queue group, exactly one beat (never two during a rollout), the api,
Flower, probes on ``prewarm health``, settings from the ConfigMap and keys from the Secret,
and no volume shared between pods.

Rendered with ``kubectl kustomize`` when the Debian package is installed; otherwise the base's
resources are read as listed in its kustomization.yaml (the same objects, without its labels).
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import pytest
import yaml

from tests.conftest import REPO_ROOT

kubernetes_validate = pytest.importorskip("kubernetes_validate")

BASE = REPO_ROOT / "config" / "kubernetes" / "prewarm"
#: the Kubernetes version the manifests are checked against
KUBERNETES = "1.30.0"
QUEUES = {"ingest", "events", "model", "warm"}


def rendered() -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl:
        text = subprocess.run([kubectl, "kustomize", str(BASE)], capture_output=True, text=True,
                              check=True, timeout=60).stdout  # fmt: skip
        return [d for d in yaml.safe_load_all(text) if d]
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    return [d for name in kustomization["resources"]
            for d in yaml.safe_load_all((BASE / name).read_text()) if d]  # fmt: skip


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return rendered()


def _deployments(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == "Deployment"}


def test_every_object_validates_against_the_api_schemas(objects):
    assert len(objects) >= 10
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)


def test_a_broken_object_is_refused():
    broken = yaml.safe_load((BASE / "beat.yaml").read_text().split("\n---\n")[0])
    broken["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES, strict=True)


def test_one_deployment_per_queue_group_exactly_one_beat_the_api_and_flower(objects):
    deployments = _deployments(objects)
    queues: set[str] = set()
    for deployment in deployments.values():
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        if args[:2] == ["prewarm", "worker"]:
            queues |= set(args[args.index("--queues") + 1].split(","))
    assert queues == QUEUES
    beat = deployments["prewarm-beat"]["spec"]
    assert beat["replicas"] == 1 and beat["strategy"]["type"] == "Recreate"
    assert {"prewarm-api", "prewarm-flower"} <= set(deployments)
    assert any(o["kind"] == "StatefulSet" and o["metadata"]["name"] == "prewarm-redis"
               for o in objects)  # fmt: skip


def test_probes_run_prewarm_health_settings_and_keys_come_from_the_configmap_and_secret(objects):
    kinds = {o["kind"]: o for o in objects}
    settings = kinds["ConfigMap"]["data"]
    assert settings["PREWARM_DATA_DIR"].startswith("s3://") and "prewarm.toml" in settings
    assert set(kinds["Secret"]["stringData"]) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    for name, deployment in _deployments(objects).items():
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        for probe in ("readinessProbe", "livenessProbe"):
            assert container[probe]["exec"]["command"][:2] == ["prewarm", "health"], name
        sources = {next(iter(s.values()))["name"] for s in container["envFrom"]}
        assert sources == {"prewarm-settings", "prewarm-object-store"}, name
        # no volume another pod shares: settings, and an emptyDir of its own
        claims = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
        assert claims == [], name
