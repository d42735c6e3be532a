"""A tiny policy and its GRPO update, in numpy: one row of logits per prompt over fixed answers.

The agent (``policy_agent.py``) samples from a saved version; the trainer (``trainer.py``)
updates it from finished groups and saves the next version. A version is one ``.npz`` file in
the policy directory, written under a temporary name and renamed, so a reader never sees half
of one, and the trainer's optimizer state is saved beside it for restarts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

import numpy as np

ANSWERS = [str(n) for n in range(5)]


def policy_dir(endpoint: str) -> Path:
    """The directory a ``file://`` policy endpoint names."""
    url = urlparse(endpoint)
    if url.scheme != "file":
        raise ValueError(f"policy endpoint {endpoint!r}: this example serves policies as file:// directories")
    return Path(unquote(url.path))


def _save(path: Path, **arrays: np.ndarray) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("wb") as fh:
        np.savez(fh, **arrays)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


@dataclass
class TablePolicy:
    """Softmax over ``answers``, with one row of logits per prompt seen in training.

    An unseen prompt gets zero logits: a uniform guess.
    """

    answers: list[str] = field(default_factory=lambda: list(ANSWERS))
    prompts: list[str] = field(default_factory=list)
    logits: np.ndarray = field(default_factory=lambda: np.zeros((0, len(ANSWERS))))

    def row(self, prompt: str) -> int:
        """The row of ``prompt``, added (zero logits) when it is new."""
        try:
            return self.prompts.index(prompt)
        except ValueError:
            self.prompts.append(prompt)
            self.logits = np.vstack([self.logits, np.zeros((1, len(self.answers)))])
            return len(self.prompts) - 1

    def probs(self, prompt: str) -> np.ndarray:
        if prompt not in self.prompts:
            return np.full(len(self.answers), 1.0 / len(self.answers))
        z = self.logits[self.prompts.index(prompt)]
        e = np.exp(z - z.max())
        return e / e.sum()

    def sample(self, prompt: str, rng: np.random.Generator) -> tuple[int, float]:
        """(answer index, its log-probability) drawn for ``prompt``."""
        p = self.probs(prompt)
        index = int(rng.choice(len(p), p=p))
        return index, float(np.log(p[index]))

    def path(self, directory: Path, version: int) -> Path:
        return directory / f"v{version:06d}.npz"

    def save(self, directory: Path, version: int) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = self.path(directory, version)
        _save(path, logits=self.logits, prompts=np.array(self.prompts, dtype=str),
              answers=np.array(self.answers, dtype=str))
        return path

    @classmethod
    def load(cls, directory: Path, version: int) -> TablePolicy:
        with np.load(directory / f"v{version:06d}.npz", allow_pickle=False) as data:
            return cls(answers=[str(a) for a in data["answers"]], prompts=[str(p) for p in data["prompts"]],
                       logits=np.array(data["logits"], dtype=float).reshape(-1, len(data["answers"])))


@dataclass
class Adam:
    """Adam for gradient ascent on the policy's logits (rows grow with the policy)."""

    lr: float = 0.3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    t: int = 0
    m: np.ndarray = field(default_factory=lambda: np.zeros((0, len(ANSWERS))))
    v: np.ndarray = field(default_factory=lambda: np.zeros((0, len(ANSWERS))))

    def step(self, params: np.ndarray, grad: np.ndarray) -> np.ndarray:
        grow = params.shape[0] - self.m.shape[0]
        if grow > 0:
            self.m = np.vstack([self.m, np.zeros((grow, params.shape[1]))])
            self.v = np.vstack([self.v, np.zeros((grow, params.shape[1]))])
        self.t += 1
        self.m = self.beta1 * self.m + (1 - self.beta1) * grad
        self.v = self.beta2 * self.v + (1 - self.beta2) * grad ** 2
        m_hat = self.m / (1 - self.beta1 ** self.t)
        v_hat = self.v / (1 - self.beta2 ** self.t)
        return params + self.lr * m_hat / (np.sqrt(v_hat) + self.eps)

    def save(self, path: Path) -> None:
        _save(path, m=self.m, v=self.v, t=np.array(self.t), lr=np.array(self.lr))

    @classmethod
    def load(cls, path: Path) -> Adam:
        with np.load(path, allow_pickle=False) as data:
            return cls(lr=float(data["lr"]), t=int(data["t"]), m=np.array(data["m"]), v=np.array(data["v"]))


@dataclass
class Sample:
    """One rollout as the update sees it: what was asked, answered, how likely, how good."""

    prompt: str
    action: int
    logprob: float  # under the policy version that sampled it
    advantage: float


def group_advantages(rewards: list[float]) -> list[float]:
    """GRPO's group-relative advantages: (reward - group mean) / group std, over the group's
    kept members; all zero when the group agrees (it carries no signal)."""
    r = np.asarray(rewards, dtype=float)
    std = r.std() if r.size else 0.0
    if std < 1e-8:
        return [0.0] * int(r.size)
    return [float(a) for a in (r - r.mean()) / std]


def grpo_step(policy: TablePolicy, adam: Adam, samples: list[Sample], clip: float = 0.3) -> float:
    """One update with the clipped surrogate (PPO/GRPO): ratio = pi_now(a) / pi_sampled(a), a
    sample whose ratio already moved past ``1 +- clip`` in its advantage's direction adds no
    gradient. Returns the fraction of samples clipped."""
    for s in samples:
        policy.row(s.prompt)
    grad = np.zeros_like(policy.logits)
    clipped = 0
    for s in samples:
        row = policy.prompts.index(s.prompt)
        p = policy.probs(s.prompt)
        ratio = float(np.exp(np.log(p[s.action]) - s.logprob))
        if (s.advantage > 0 and ratio > 1 + clip) or (s.advantage < 0 and ratio < 1 - clip):
            clipped += 1
            continue
        one_hot = np.zeros(len(p))
        one_hot[s.action] = 1.0
        grad[row] += s.advantage * ratio * (one_hot - p)  # d/dlogits of ratio * A
    if samples:
        policy.logits = adam.step(policy.logits, grad / len(samples))
    return clipped / max(len(samples), 1)
