"""The compose loop (``test_compose_loop``) with shared state in a bucket: every compose
service's own command runs locally, ``data_dir`` is a prefix of a bucket on a real S3 endpoint
(moto's server over HTTP, ``tests/integration/s3_server.py``; endpoint and keys in the services'
environment, as ``config/object-store.env`` gives them), and each prewarm service has a
``local_dir`` of its own: no folder is shared between them. The simulator writes its log into
its own folder, where the ingest worker reads it (the engine host's log).

Traffic over chat and completions for a few windows, the simulator restarts; at least 90% of
the templates used twice or more are served from cache on their first request after the
restart, and afterwards no file of shared state is under any service's folder.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from models.forecaster import SAVED_NAME
from tasks.adapters.shared_store import shared_store
from tasks.settings import load_settings
from tests.integration.s3_server import BUCKET, s3_endpoint
from tests.integration.test_compose import LocalStack
from tests.integration.test_compose_loop import (
    HEALTHY_WITHIN_S,
    WINDOW_S,
    restart_and_ask,
    send_traffic,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

#: shared state, wherever it would be written: observations, models, KV-event state, json state
SHARED_SUFFIXES = {".parquet", ".json", ".msgpack", ".joblib", ".pkl", ".npz", ".claim"}
SHARED_FOLDERS = {"observations", "models", "kv", "predictions"}


def shared_files_under(folder: Path) -> list[str]:
    """Files of shared state under a service's folder (its log and beat file are its own)."""
    found = []
    for path in folder.rglob("*"):
        rel = path.relative_to(folder)
        if path.is_file() and (
            path.suffix in SHARED_SUFFIXES
            or path.name == "current"
            or SHARED_FOLDERS & set(rel.parts[:-1])
        ):
            found.append(str(rel))
    return sorted(found)


def test_the_services_warm_a_restarted_simulator_with_state_in_a_bucket(tmp_path, monkeypatch):
    changes = {
        "window_s = 300": f"window_s = {WINDOW_S}",
        "replica_watch_s = 10": "replica_watch_s = 1",
        # a forecaster after two windows (as test_object_store): its files go to the bucket,
        # and a worker's checked-out copy must not stay in its local_dir
        "[budget]": "[loop]\nmin_windows_for_model = 2\n\n[budget]",
    }
    data_dir = f"s3://{BUCKET}/{tmp_path.name}"
    with s3_endpoint(monkeypatch) as endpoint:
        env = {**endpoint.env(), "PREWARM_DATA_DIR": data_dir}
        stack = LocalStack(tmp_path, changes, env=env, own_local_dirs=True)
        try:
            stack.start()
            stack.wait_healthy(within_s=HEALTHY_WITHIN_S)
            sim = stack.services["simulator"]
            url = f"http://127.0.0.1:{sim.ports[8000]}"
            used = send_traffic(url)

            assert load_settings(stack.services["beat"].env).data_dir == data_dir
            outcome, answered, deadline, share, results = restart_and_ask(stack, url, used)

            keys = set(shared_store(data_dir).walk(""))
            print("bucket keys:", sorted(keys), flush=True)
            leftovers = {
                name: shared_files_under(service.workdir)
                for name, service in stack.services.items()
                if name != "simulator"
            }
            leftovers["simulator (engine host)"] = shared_files_under(stack.data_dir)
            leftovers["simulator (its cwd)"] = shared_files_under(sim.workdir)
            print("shared files under the services' folders:", leftovers, flush=True)

            assert outcome is not None, stack.services["worker-ingest"].log_tail()
            assert answered <= deadline
            assert share >= 0.9, results
            assert {
                "observations/simulator/records.parquet",
                "observations/simulator/counts.parquet",
                "observations/simulator/manifest.json",
            } <= keys, sorted(keys)
            assert f"models/simulator/{SAVED_NAME}/current" in keys, sorted(keys)
            assert all(files == [] for files in leftovers.values()), leftovers
            assert sorted(p.name for p in stack.data_dir.iterdir()) == ["engine.log"]
        finally:
            stack.stop()
