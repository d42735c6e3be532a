"""Substrate tokens are derived from the substrate key under a worker secret (client/tokens.py).

The secret is ``$ROLLOUTS_TOKEN_SECRET`` or a per-home ``token.secret`` file created once (mode
0600, one secret even when several processes create it at once). Endpoints of built-in providers
carry no token; steps derive it again, and a rejected derived token names the secret to share.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import multiprocessing
import stat
from pathlib import Path
from typing import Any

import pytest

from durable_rollouts.client.tokens import (
    SECRET_ENV_VAR,
    derived_params,
    endpoint_token,
    secret_path,
    substrate_token,
)
from durable_rollouts.envserver import Environment, serving
from durable_rollouts.errors import ConfigError, UnauthorizedError
from durable_rollouts.models import Endpoint, ProviderSpec
from durable_rollouts.step_io import ConnectInput
from durable_rollouts.steps import substrate as steps

env = Environment(name="tok", version="0.1.0")


@env.template()
async def echo(word: str = "x"):
    answer = yield f"say {word}"
    yield 1.0 if answer == word else 0.0


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh ROLLOUTS_HOME without a token secret, and no secret in the environment."""
    monkeypatch.setenv("ROLLOUTS_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(SECRET_ENV_VAR, raising=False)
    return tmp_path / "home"


def _expected(secret: bytes, key: str) -> str:
    digest = hmac.new(secret, key.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def test_the_token_is_the_urlsafe_hmac_of_the_key_under_a_secret_file_created_once_with_mode_0600(
    home: Path,
) -> None:
    assert not secret_path().exists()
    token = substrate_token("job-a-t-0")
    path = home / "token.secret"
    assert secret_path() == path
    secret = path.read_bytes()
    assert len(secret) == 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert token == _expected(secret, "job-a-t-0")
    assert "=" not in token and len(token) == 43
    assert substrate_token("job-a-t-0") == token  # stable: the file is not rewritten
    assert path.read_bytes() == secret
    assert [p.name for p in home.iterdir()] == ["token.secret"]  # no temp file left behind


def test_tokens_differ_per_key_and_per_secret(home: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    first = substrate_token("key-1")
    assert substrate_token("key-2") != first
    assert substrate_token("key-1-verifier") != first
    monkeypatch.setenv("ROLLOUTS_HOME", str(tmp_path / "other-home"))  # another host's secret
    assert substrate_token("key-1") != first
    monkeypatch.setenv(SECRET_ENV_VAR, "alpha")
    alpha = substrate_token("key-1")
    monkeypatch.setenv(SECRET_ENV_VAR, "beta")
    assert substrate_token("key-1") != alpha


def test_the_environment_variable_wins_over_the_file_and_creates_none(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from_file = substrate_token("k")
    monkeypatch.setenv(SECRET_ENV_VAR, "shared-by-every-host")
    shared = substrate_token("k")
    assert shared == _expected(b"shared-by-every-host", "k") and shared != from_file
    monkeypatch.setenv("ROLLOUTS_HOME", str(tmp_path / "second-host"))
    assert substrate_token("k") == shared  # hosts with different homes agree
    assert not (tmp_path / "second-host").exists()


def _race(home: str, barrier: Any, rounds: int, out: Any) -> None:
    import os

    tokens = []
    for i in range(rounds):
        os.environ["ROLLOUTS_HOME"] = f"{home}/{i}"
        barrier.wait(60)  # every process reaches the missing file at the same moment
        tokens.append(substrate_token("race"))
    out.put(tokens)


def test_processes_creating_the_secret_at_once_end_with_one_secret(home: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    workers, rounds = 6, 15
    barrier, out = ctx.Barrier(workers), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(str(home), barrier, rounds, out)) for _ in range(workers)]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=90) for _ in procs]
    for proc in procs:
        proc.join(10)
        assert proc.exitcode == 0
    for i in range(rounds):
        folder = home / str(i)
        secret = (folder / "token.secret").read_bytes()
        assert {tokens[i] for tokens in results} == {_expected(secret, "race")}, f"round {i}"
        assert [p.name for p in folder.iterdir()] == ["token.secret"]
        assert stat.S_IMODE((folder / "token.secret").stat().st_mode) == 0o600


def _endpoint(url: str, params: dict[str, object], key: str = "job-x-t-0") -> Endpoint:
    return Endpoint(url=url, params=params, provider=ProviderSpec(kind="docker"), key=key)


def test_an_endpoint_names_its_token_source_but_never_the_token(home: Path) -> None:
    derived = _endpoint("tcp://127.0.0.1:1", derived_params(ready_timeout=5.0))
    assert endpoint_token(derived) == substrate_token("job-x-t-0")
    assert substrate_token("job-x-t-0") not in derived.model_dump_json()
    old_history = _endpoint("tcp://127.0.0.1:1", {"token": "recorded", "token_from": "key"})
    assert endpoint_token(old_history) == "recorded"
    assert endpoint_token(_endpoint("tcp://127.0.0.1:1", {})) is None


async def test_steps_connect_with_the_derived_token(home: Path) -> None:
    async with serving(env, token=substrate_token("job-x-t-0")) as server:
        session = await steps.connect(ConnectInput(endpoint=_endpoint(server.url, derived_params())))
    assert session.env_name == "tok"


async def test_a_rejected_derived_token_says_to_share_the_secret_in_one_line(home: Path) -> None:
    async with serving(env, token="made-by-a-worker-with-another-secret") as server:
        with pytest.raises(UnauthorizedError) as info:
            await steps.connect(ConnectInput(endpoint=_endpoint(server.url, derived_params())))
    message = str(info.value)
    assert SECRET_ENV_VAR in message and "different hosts" in message, message
    assert "\n" not in message


def test_a_home_where_no_secret_can_be_created_is_a_config_error_naming_the_variable(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("ROLLOUTS_HOME", str(blocker / "home"))
    with pytest.raises(ConfigError, match=SECRET_ENV_VAR):
        substrate_token("k")
