"""Graders for task bodies: text matchers, a bash grader, an LLM judge, and ``combine``.

Used inside an environment's task (``yield combine(...)`` or ``yield exact_match(...)``). A
grader returns a float in [0, 1] or a :class:`SubScore`; ``combine`` folds sub-scores into an
:class:`EvaluationResult` whose ``to_frame()`` is a valid ``tasks.grade`` frame. Imports httpx
(for the judge) and the shared models; nothing from envserver or sdk.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import os
import re
import string
from collections import Counter
from collections.abc import Awaitable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .models import SubScore
from .processes import kill_session

__all__ = [
    "BashGrader",
    "EvaluationResult",
    "LLMJudgeGrader",
    "SubScore",
    "combine",
    "combine_all",
    "combine_any",
    "contains",
    "contains_all",
    "contains_any",
    "exact_match",
    "f1_score",
    "normalize",
    "numeric_match",
]

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# Text graders

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_NUMBER = re.compile(r"[-+]?(?:\d+(?:,\d{3})*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


def normalize(text: Any) -> str:
    """Lower-case, drop punctuation and articles, collapse whitespace."""
    text = str(text if text is not None else "").lower()
    text = "".join(ch for ch in text if ch not in string.punctuation)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(answer: Any, expected: Any, *, normalize_text: bool = True) -> float:
    """1.0 when ``answer`` equals ``expected`` (after :func:`normalize` by default)."""
    if normalize_text:
        return 1.0 if normalize(answer) == normalize(expected) else 0.0
    return 1.0 if str(answer) == str(expected) else 0.0


def _fold(text: Any, case_sensitive: bool) -> str:
    text = str(text if text is not None else "")
    return text if case_sensitive else text.lower()


def contains(answer: Any, needle: str, *, case_sensitive: bool = False) -> float:
    """1.0 when ``needle`` occurs in ``answer``."""
    return 1.0 if _fold(needle, case_sensitive) in _fold(answer, case_sensitive) else 0.0


def contains_any(answer: Any, needles: Sequence[str], *, case_sensitive: bool = False) -> float:
    """1.0 when at least one of ``needles`` occurs in ``answer``."""
    return 1.0 if any(contains(answer, n, case_sensitive=case_sensitive) for n in needles) else 0.0


def contains_all(answer: Any, needles: Sequence[str], *, case_sensitive: bool = False) -> float:
    """1.0 when every one of ``needles`` occurs in ``answer``."""
    return 1.0 if all(contains(answer, n, case_sensitive=case_sensitive) for n in needles) else 0.0


def _first_number(text: Any) -> float | None:
    match = _NUMBER.search(str(text if text is not None else ""))
    if match is None:
        return None
    try:
        return float(match.group().replace(",", ""))
    except ValueError:
        return None


def numeric_match(answer: Any, expected: float | str, *, tolerance: float = 0.0) -> float:
    """1.0 when the first number in ``answer`` is within ``tolerance`` of ``expected``."""
    got = answer if isinstance(answer, (int, float)) and not isinstance(answer, bool) else _first_number(answer)
    want = expected if isinstance(expected, (int, float)) else _first_number(expected)
    if got is None or want is None:
        return 0.0
    return 1.0 if math.isclose(float(got), float(want), rel_tol=0.0, abs_tol=tolerance) else 0.0


def f1_score(answer: Any, expected: Any) -> float:
    """Token-level F1 between the normalized answer and expected text."""
    got, want = normalize(answer).split(), normalize(expected).split()
    if not got or not want:
        return 1.0 if got == want else 0.0
    common = sum((Counter(got) & Counter(want)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(got), common / len(want)
    return 2 * precision * recall / (precision + recall)


# ---------------------------------------------------------------------------------------------
# Result types


class EvaluationResult(BaseModel):
    """A full grade: reward plus everything a trainer might want to see."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    reward: float
    done: bool = True
    content: str | None = None
    info: dict[str, Any] = Field(default_factory=dict)
    isError: bool = False  # noqa: N815 - the wire name
    subscores: list[SubScore] = Field(default_factory=list)

    def to_frame(self) -> dict[str, Any]:
        """The ``tasks.grade`` frame: ``score`` plus the other fields."""
        frame = self.model_dump(mode="json")
        frame["score"] = frame.pop("reward")
        return frame


def _clamp(value: float) -> float:
    return min(1.0, max(0.0, float(value)))


class _Grader:
    """Shared ``grade(weight, name, **kw)`` plumbing: wrap a score into a SubScore."""

    name: str = "grader"

    @classmethod
    async def grade(cls, weight: float = 1.0, name: str | None = None, **kwargs: Any) -> SubScore:
        result = cls.compute(**kwargs)
        if inspect.isawaitable(result):
            result = await result
        info: dict[str, Any] = {}
        if isinstance(result, SubScore):
            return result.model_copy(update={"weight": weight, "name": name or result.name})
        if isinstance(result, tuple):
            result, info = result
        params = {k: v for k, v in kwargs.items() if k != "api_key"}
        return SubScore(name=name or cls.name, value=_clamp(result), weight=weight,
                        info={"params": params, **info})

    @classmethod
    def compute(cls, **kwargs: Any) -> Any:
        raise NotImplementedError


# ---------------------------------------------------------------------------------------------
# Bash


class BashGrader(_Grader):
    """Run ``bash -lc COMMAND``; score 1.0 when it exits 0 (killed after ``timeout`` seconds)."""

    name = "bash"

    @classmethod
    async def compute(cls, command: str, cwd: str | None = None, timeout: float = 600.0,  # type: ignore[override]
                      env: dict[str, str] | None = None) -> tuple[float, dict[str, Any]]:
        proc = await asyncio.create_subprocess_exec(
            "bash", "-lc", command, cwd=cwd, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, **(env or {})}, start_new_session=True,
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout)
        except asyncio.TimeoutError:
            kill_session(proc.pid)  # bash and whatever it started
            await proc.wait()
            return 0.0, {"exit_code": None, "timed_out": True, "output": ""}
        except asyncio.CancelledError:
            kill_session(proc.pid)
            await proc.wait()
            raise
        text = out.decode(errors="replace")[-4000:]
        return (1.0 if proc.returncode == 0 else 0.0), {"exit_code": proc.returncode, "output": text}


# ---------------------------------------------------------------------------------------------
# LLM judge


_JUDGE_PROMPT = """You are grading an answer against one criterion.
Question: {question}
Answer: {answer}
Criterion: {criterion}
Reply with exactly one word: MET if the answer satisfies the criterion, UNMET otherwise."""


class LLMJudgeGrader(_Grader):
    """Judge ``answer`` against each criterion with an OpenAI-compatible chat model.

    ``criteria`` is a list of strings or ``(criterion, weight)`` pairs (negative weight: a
    penalty when MET). Every criterion is judged in parallel as MET/UNMET; the value is the
    weighted sum over the positive weights, clamped to [0, 1]. ``base_url`` and ``api_key``
    default to ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``.
    """

    name = "llm_judge"

    @classmethod
    async def compute(cls, answer: str, criteria: Sequence[str | tuple[str, float]],  # type: ignore[override]
                      question: str = "", model: str = "gpt-4o-mini", base_url: str | None = None,
                      api_key: str | None = None, timeout: float = 60.0) -> tuple[float, dict[str, Any]]:
        import httpx

        base = (base_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1").rstrip("/")
        key = api_key or os.environ.get("OPENAI_API_KEY")
        pairs = [(c, 1.0) if isinstance(c, str) else (str(c[0]), float(c[1])) for c in criteria]
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        async with httpx.AsyncClient(timeout=timeout, headers=headers) as client:
            verdicts = await asyncio.gather(*(
                _judge(client, base, model, question, answer, c) for c, _ in pairs))
        positive = sum(w for _, w in pairs if w > 0) or 1.0
        total = sum(w for (_, w), met in zip(pairs, verdicts) if met)
        info = {"verdicts": [{"criterion": c, "weight": w, "met": m} for (c, w), m in zip(pairs, verdicts)]}
        return _clamp(total / positive), info


async def _judge(client: Any, base: str, model: str, question: str, answer: str, criterion: str) -> bool:
    url = base if base.endswith("/chat/completions") else f"{base}/chat/completions"
    prompt = _JUDGE_PROMPT.format(question=question, answer=answer, criterion=criterion)
    response = await client.post(url, json={
        "model": model, "temperature": 0,
        "messages": [{"role": "user", "content": prompt}],
    })
    response.raise_for_status()
    text = str(response.json()["choices"][0]["message"]["content"] or "").strip().upper()
    return text.startswith("MET")


# ---------------------------------------------------------------------------------------------
# Combinators


async def _gather(items: Sequence[SubScore | Awaitable[SubScore]]) -> list[SubScore]:
    return list(await asyncio.gather(*(_ready(i) for i in items)))


async def _ready(item: SubScore | Awaitable[SubScore]) -> SubScore:
    return await item if inspect.isawaitable(item) else item


def _dedupe(scores: list[SubScore]) -> list[SubScore]:
    seen: Counter[str] = Counter()
    out = []
    for s in scores:
        seen[s.name] += 1
        out.append(s if seen[s.name] == 1 else s.model_copy(update={"name": f"{s.name}_{seen[s.name]}"}))
    return out


async def combine(*items: SubScore | Awaitable[SubScore], content: str | None = None) -> EvaluationResult:
    """Weighted sum of sub-scores; positive weights are normalised to sum to 1, negative
    weights are kept as penalties; the reward is clamped to [0, 1]."""
    scores = _dedupe(await _gather(items))
    positive = sum(s.weight for s in scores if s.weight > 0)
    if positive and not math.isclose(positive, 1.0):
        log.warning("combine: positive weights sum to %s; normalising to 1", positive)
    scale = 1.0 / positive if positive else 1.0
    normalised = [s.model_copy(update={"weight": s.weight * scale if s.weight > 0 else s.weight}) for s in scores]
    reward = _clamp(sum(s.weight * s.value for s in normalised))
    return EvaluationResult(reward=reward, content=content, subscores=normalised)


async def combine_any(*items: SubScore | Awaitable[SubScore]) -> EvaluationResult:
    """The best sub-score wins."""
    scores = _dedupe(await _gather(items))
    return EvaluationResult(reward=max((s.value for s in scores), default=0.0), subscores=scores)


async def combine_all(*items: SubScore | Awaitable[SubScore]) -> EvaluationResult:
    """The worst sub-score wins."""
    scores = _dedupe(await _gather(items))
    return EvaluationResult(reward=min((s.value for s in scores), default=0.0), subscores=scores)
