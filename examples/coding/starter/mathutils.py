"""Small numeric helpers used by the coding example (this copy has a bug)."""


def clamp(x: float, lo: float, hi: float) -> float:
    """Limit ``x`` to the closed interval [lo, hi]."""
    return max(lo, min(x, lo))


def mean(xs: list[float]) -> float:
    """The arithmetic mean of a non-empty list."""
    return sum(xs) / len(xs)
