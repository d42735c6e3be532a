"""Reward against training step, as a PNG: matplotlib when it is installed, else a plain chart.

The fallback writes the PNG itself (zlib + struct): a framed chart with grid lines, the reward
per step as dots joined by a line, the uniform guess as a dotted line and the trainer restart as a
dashed red line, but no text.
"""

from __future__ import annotations

import itertools
import struct
import zlib
from pathlib import Path


def plot_rewards(rewards: list[float], path: Path, *, restart_after: int | None = None,
                 guess: float | None = None, title: str = "GRPO on the sums env: reward per step") -> str:
    """Write the chart to ``path``; returns which writer drew it (``matplotlib`` or ``plain``).

    ``rewards[i]`` is the mean reward of step ``i + 1``; ``restart_after``: the last step of the
    trainer that was killed; ``guess``: what a uniform guess scores.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        write_png(path, _chart(rewards, restart_after, guess))
        return "plain"
    steps = list(range(1, len(rewards) + 1))
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=110)
    ax.plot(steps, rewards, marker="o", markersize=3.5, linewidth=1.4, label="mean reward of the step's groups")
    if restart_after is not None:
        ax.axvline(restart_after + 0.5, color="tab:red", linestyle="--", linewidth=1.2,
                   label=f"trainer SIGKILLed after step {restart_after}, restarted")
    if guess is not None:
        ax.axhline(guess, color="gray", linestyle=":", linewidth=1.2, label=f"uniform guess ({guess:.1f})")
    ax.set_xlabel("training step (one GRPO update per batch of finished groups)")
    ax.set_ylabel("mean reward")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return "matplotlib"


WIDTH, HEIGHT, MARGIN = 640, 320, 30
WHITE, GRID, FRAME, LINE, RED = (255, 255, 255), (225, 225, 225), (60, 60, 60), (31, 119, 180), (214, 39, 40)


def _chart(rewards: list[float], restart_after: int | None,
           guess: float | None) -> list[list[tuple[int, int, int]]]:
    pixels = [[WHITE] * WIDTH for _ in range(HEIGHT)]
    left, right, top, bottom = MARGIN, WIDTH - MARGIN, MARGIN, HEIGHT - MARGIN
    n = max(len(rewards), 2)

    def xy(step: float, reward: float) -> tuple[int, int]:
        return (round(left + (step - 1) * (right - left) / (n - 1)),
                round(bottom - max(0.0, min(1.0, reward)) * (bottom - top)))

    for tenth in range(11):
        y = round(bottom - tenth * (bottom - top) / 10)
        _line(pixels, left, y, right, y, FRAME if tenth in (0, 10) else GRID)
    _line(pixels, left, top, left, bottom, FRAME)
    _line(pixels, right, top, right, bottom, FRAME)
    if restart_after is not None:
        x = xy(restart_after + 0.5, 0)[0]
        for y in range(top, bottom, 8):
            _line(pixels, x, y, x, min(y + 4, bottom), RED)
    if guess is not None:
        y = xy(1, guess)[1]
        for x in range(left, right, 6):
            _line(pixels, x, y, min(x + 2, right), y, FRAME)
    points = [xy(i + 1, r) for i, r in enumerate(rewards)]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        _line(pixels, x0, y0, x1, y1, LINE)
    for x, y in points:
        for dx in range(-2, 3):
            for dy in range(-2, 3):
                _put(pixels, x + dx, y + dy, LINE)
    return pixels


def _put(pixels: list[list[tuple[int, int, int]]], x: int, y: int, color: tuple[int, int, int]) -> None:
    if 0 <= y < len(pixels) and 0 <= x < len(pixels[0]):
        pixels[y][x] = color


def _line(pixels: list[list[tuple[int, int, int]]], x0: int, y0: int, x1: int, y1: int,
          color: tuple[int, int, int]) -> None:
    steps = max(abs(x1 - x0), abs(y1 - y0), 1)
    for i in range(steps + 1):
        _put(pixels, round(x0 + (x1 - x0) * i / steps), round(y0 + (y1 - y0) * i / steps), color)


def write_png(path: Path, pixels: list[list[tuple[int, int, int]]]) -> None:
    """An 8-bit RGB PNG of ``pixels`` (rows of (r, g, b))."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    height, width = len(pixels), len(pixels[0])
    raw = b"".join(b"\x00" + bytes(v for px in row for v in px) for row in pixels)
    path.write_bytes(b"\x89PNG\r\n\x1a\n"
                     + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
