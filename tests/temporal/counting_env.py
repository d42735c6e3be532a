"""Test environments that leave evidence on disk: the pid serving a task, every setup and grade.

``echo`` writes its server's pid to ``pid_file`` when the task starts, appends ``<tag> <pid>`` to
``start_log`` for every real setup, and one line to ``grade_log`` per *real* grade (a cached,
idempotent re-grade writes nothing), so crash tests can kill the substrate and count setups and
grades on the env side. ``referee`` is a verifier that may sleep
while grading (so a test can kill its substrate mid-verify) and logs its grades the same way.
"""

from __future__ import annotations

import asyncio
import os

from durable_rollouts.envserver import Environment

env = Environment(name="counting", version="1.0.0")
referee_env = Environment(name="referee", version="1.0.0")


def _append(path: str, line: str) -> None:
    if path:
        with open(path, "a") as fh:
            fh.write(line + "\n")


def _write(path: str, text: str) -> None:
    if path:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)


@env.template(description="Answer with `expected`; logs pid at start and every real grade.")
async def echo(expected: str = "x", grade_log: str = "", pid_file: str = "", tag: str = "",
               start_log: str = ""):
    _write(pid_file, str(os.getpid()))
    _append(start_log, f"{tag} {os.getpid()}")
    answer = yield f"Say {expected!r}."
    _append(grade_log, f"{tag} {os.getpid()} {answer}")
    yield {"score": 1.0 if str(answer or "").strip() == expected else 0.0, "info": {"answer": answer}}


@referee_env.template(description="Verifier: 1.0 when the actor's answer equals `expected`.")
async def referee(expected: str = "x", grade_log: str = "", pid_file: str = "", delay: float = 0.0):
    frame = yield "Referee the actor."
    _write(pid_file, str(os.getpid()))
    if delay:
        await asyncio.sleep(delay)
    answer = ((frame or {}).get("info") or {}).get("answer") if isinstance(frame, dict) else None
    _append(grade_log, f"referee {os.getpid()} {answer}")
    yield 1.0 if str(answer or "").strip() == expected else 0.0
