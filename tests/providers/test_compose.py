"""docker-compose.yml validates with docker-compose and defines a scalable worker service.

The stack itself cannot run here (no registry for the Temporal and PostgreSQL images), so the
test runs `docker-compose config`, which parses, interpolates and validates the whole file.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from substrates_support import REPO

pytestmark = pytest.mark.skipif(
    shutil.which("docker-compose") is None,
    reason="docker-compose is not installed (apt-get install -y docker-compose)",
)


def _compose(*args: str) -> str:
    result = subprocess.run(
        ["docker-compose", "-f", str(REPO / "docker-compose.yml"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_compose_file_validates_with_temporal_postgres_ui_and_workers():
    services = set(_compose("config", "--services").split())
    assert {"postgresql", "temporal", "temporal-ui", "worker"} <= services


def test_worker_service_builds_from_the_repository_and_can_be_scaled():
    yaml = pytest.importorskip("yaml", reason="PyYAML is needed to inspect the resolved file")
    config = yaml.safe_load(_compose("config"))
    assert config["services"]["temporal"]["environment"]["DB"] == "postgres12"
    assert config["services"]["temporal-ui"]["environment"]["TEMPORAL_ADDRESS"] == "temporal:7233"
    worker = config["services"]["worker"]
    assert worker["build"]["dockerfile"] == "Dockerfile"
    assert "container_name" not in worker and "ports" not in worker  # --scale worker=N works
    assert worker["environment"]["ROLLOUTS_TEMPORAL_ADDRESS"] == "temporal:7233"
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "FROM ${BASE_IMAGE}" in dockerfile and "durable_rollouts.worker" in dockerfile


def test_the_stacks_temporal_gets_the_history_keys_the_embedded_server_sets():
    """The compose Temporal loads ``docker/dynamicconfig/rollouts.yaml``, which sets every
    ``history.*`` key the embedded dev server sets, to the same value (the stream's query buffer,
    the transfer reader's rate)."""
    yaml = pytest.importorskip("yaml", reason="PyYAML is needed to inspect the resolved file")
    from durable_rollouts.temporal.connection import dev_server_args

    temporal = yaml.safe_load(_compose("config"))["services"]["temporal"]
    path = temporal["environment"]["DYNAMIC_CONFIG_FILE_PATH"]
    mounts = [v if isinstance(v, str) else f"{v['source']}:{v['target']}:ro" * bool(v.get("read_only"))
              for v in temporal["volumes"]]  # short or long syntax, by docker-compose version
    assert path == "config/dynamicconfig/rollouts.yaml"
    assert f"{REPO / 'docker' / 'dynamicconfig'}:/etc/temporal/config/dynamicconfig:ro" in mounts, mounts
    loaded = yaml.safe_load((REPO / "docker" / "dynamicconfig" / "rollouts.yaml").read_text())
    args = dev_server_args(7233, None, None)
    embedded = dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--dynamic-config-value")
    history = {k: v for k, v in embedded.items() if k.startswith("history.")}
    assert set(history) == {"history.transferProcessorMaxPollRPS", "history.MaxBufferedQueryCount"}
    assert {k: str(loaded[k][0]["value"]) for k in history} == history
