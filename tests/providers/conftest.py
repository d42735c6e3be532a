"""Fixtures for the substrate tests: a reachable Docker engine and the locally built test image.

The test image is built from docker/env.Dockerfile on the base image of
docker/make-base-image.sh (no registry involved). Its tag is a digest of the package sources,
the image recipes and tests/providers/envimage/, so a session rebuilds it only when one of them
changed (a few seconds; the expensive debootstrap OS image is built once per machine).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from substrates_support import ENV_IMAGE_DIR, KEY_LABEL, REPO, TEST_KEY_PREFIX
from temporal_fixtures import client, dev_server  # noqa: F401  (shared fixtures)


def _sources_digest() -> str:
    h = hashlib.sha256()
    roots = [REPO / "durable_rollouts", REPO / "docker", ENV_IMAGE_DIR]
    for root in roots:
        for path in sorted(
            p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts
        ):
            h.update(str(path.relative_to(REPO)).encode())
            h.update(path.read_bytes())
    h.update((REPO / "pyproject.toml").read_bytes())
    return h.hexdigest()[:12]


def _docker_client():  # type: ignore[no-untyped-def]
    from docker.errors import DockerException

    import docker

    try:
        client = docker.from_env()
        client.ping()
    except DockerException as exc:
        pytest.skip(
            f"no Docker engine reachable ({exc}); start dockerd to run the docker tests "
            "(see docker/README.md)"
        )
    return client


@pytest.fixture(scope="session")
def docker_client() -> Iterator[object]:
    client = _docker_client()
    yield client
    # Nothing a test started may survive the session: sweep containers of test keys.
    for c in client.containers.list(all=True, filters={"label": KEY_LABEL}):
        if c.labels.get(KEY_LABEL, "").startswith(TEST_KEY_PREFIX):
            c.remove(force=True)
    client.close()


def _prune_old_tags(client: object, prefix: str, keep: str) -> None:
    """Remove earlier test builds (tags starting with ``prefix``) so they do not pile up."""
    from docker.errors import APIError

    for image in client.images.list(name=prefix.split(":")[0]):  # type: ignore[attr-defined]
        for tag in image.tags:
            if tag.startswith(prefix) and tag != keep:
                try:
                    client.images.remove(tag)  # type: ignore[attr-defined]
                except APIError:
                    pass  # still used by a container: leave it


@pytest.fixture(scope="session")
def test_image(docker_client: object) -> str:
    """The env image of tests/providers/envimage, built once (per source digest) if missing."""
    from docker.errors import ImageNotFound

    digest = _sources_digest()
    tag = f"durable-rollouts-test-env:{digest}"
    try:
        docker_client.images.get(tag)  # type: ignore[attr-defined]
        return tag
    except ImageNotFound:
        pass
    base = f"durable-rollouts-base:test-{digest}"
    env = dict(os.environ, ROLLOUTS_BASE_IMAGE=base, PYTHON=sys.executable)
    build = subprocess.run(
        ["bash", str(REPO / "docker" / "make-base-image.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if build.returncode != 0:
        pytest.fail(f"docker/make-base-image.sh failed:\n{build.stdout}\n{build.stderr}")
    env_build = subprocess.run(
        [
            "docker",
            "build",
            "-q",
            "-f",
            str(REPO / "docker" / "env.Dockerfile"),
            "--build-arg",
            f"BASE_IMAGE={base}",
            "-t",
            tag,
            str(ENV_IMAGE_DIR),
        ],
        env=dict(os.environ, DOCKER_BUILDKIT="0"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    if env_build.returncode != 0:
        pytest.fail(f"building the test env image failed:\n{env_build.stdout}\n{env_build.stderr}")
    _prune_old_tags(docker_client, "durable-rollouts-test-env:", tag)
    _prune_old_tags(docker_client, "durable-rollouts-base:test-", base)
    return tag


@pytest.fixture
def temporal_address(dev_server: object) -> str:
    """The address of this directory's session dev server (``temporal_fixtures``)."""
    return dev_server.address  # type: ignore[attr-defined]
