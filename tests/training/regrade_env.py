"""The counting env with a changed reward function, for the re-grade tests: ``echo`` takes the
same arguments, but a lowercase answer equal to ``expected`` now scores 0.25 (the upper-cased
answer 1.0), grading ``expected="boom"`` raises, and every real grade is logged to
``grade_log`` with the tag ``v2``."""

from __future__ import annotations

import os

from durable_rollouts.envserver import Environment

env = Environment(name="counting", version="2.0.0")


def _log(path: str, line: str) -> None:
    if path:
        with open(path, "a") as fh:
            fh.write(line + "\n")


@env.template(description="Answer with `expected` upper-cased; the plain answer scores 0.25.")
async def echo(expected: str = "x", grade_log: str = "", pid_file: str = "", tag: str = ""):
    answer = yield f"Say {expected!r}."
    _log(grade_log, f"v2 {os.getpid()} {answer}")
    if expected == "boom":
        raise RuntimeError("this grader rejects boom")
    text = str(answer or "").strip()
    yield {"score": 1.0 if text == expected.upper() else 0.25 if text == expected else 0.0,
           "info": {"answer": answer}}
