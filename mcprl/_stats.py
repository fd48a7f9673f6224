"""Success rates with their uncertainty: counts, Wilson intervals, and whether a difference is
larger than the noise.

    rate(11, 24)                       -> "11 of 24 (46%, 95% CI 28–65%)"
    difference((1, 24), (11, 24))      -> "+42 points (95% CI +18 to +61)"
    difference((5, 24), (7, 24))       -> "+8 points (95% CI -16 to +31): within the noise"

Wilson's score interval stays inside [0, 1] and is honest at the small counts an evaluation
has (24 attempts); the interval of a difference is Newcombe's, built from the two Wilson
intervals. A difference whose interval holds 0 is within the noise. Attempts are counted as
independent; attempts seeded alike across two models are not, so the interval is on the wide
side.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = [
    "chain_counts",
    "counts",
    "describe_chains",
    "describe_yes_no",
    "difference",
    "own_counts",
    "rate",
    "split_metrics",
    "wilson",
]

Z95 = 1.959964


def wilson(successes: float, n: float, z: float = Z95) -> tuple[float, float]:
    """The 95% Wilson score interval of a rate of `successes` in `n` ((0, 1) for n = 0)."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def counts(metrics: dict[str, float]) -> tuple[int, int] | None:
    """(successes, attempts checked) of a summary's metrics (`mcprl.collect.summarize`), or
    None where it holds only the rate (older records)."""
    if "successes" not in metrics or "checked_attempts" not in metrics:
        return None
    return round(metrics["successes"]), round(metrics["checked_attempts"])


def own_counts(metrics: dict[str, float]) -> tuple[int, int] | None:
    """(successes, attempts checked) of the policy's own attempts in a summary's metrics:
    `own_successes` of `own_attempts` where the training loop started some, every checked
    attempt where it started none; None where it holds only the rate (older records)."""
    if "own_attempts" in metrics:
        return round(metrics["own_successes"]), round(metrics["own_attempts"])
    return counts(metrics)


def rate(successes: int, n: int) -> str:
    """ "11 of 24 (46%, 95% CI 28–65%)"."""
    if n <= 0:
        return "0 of 0"
    low, high = wilson(successes, n)
    return f"{successes} of {n} ({successes / n:.0%}, 95% CI {100 * low:.0f}–{high:.0%})"


def difference(before: tuple[int, int], after: tuple[int, int]) -> str:
    """How far the rate moved from `before` to `after` (each (successes, n)), in points, with
    Newcombe's 95% interval, and "within the noise" when that interval holds 0."""
    (k1, n1), (k2, n2) = before, after
    if n1 <= 0 or n2 <= 0:
        return "no attempts to compare"
    p1, p2 = k1 / n1, k2 / n2
    (l1, u1), (l2, u2) = wilson(k1, n1), wilson(k2, n2)
    d = p2 - p1
    low = d - math.sqrt((p2 - l2) ** 2 + (u1 - p1) ** 2)
    high = d + math.sqrt((u2 - p2) ** 2 + (p1 - l1) ** 2)
    text = f"{100 * d:+.0f} points (95% CI {100 * low:+.0f} to {100 * high:+.0f})"
    return text + (": within the noise" if low <= 0 <= high else "")


def split_metrics(row: dict[str, Any], split: str = "val") -> dict[str, Any]:
    """A history row's metrics of one split, without its prefix (`val/success` as `success`)."""
    prefix = f"{split}/"
    return {k.removeprefix(prefix): v for k, v in row.items() if k.startswith(prefix)}


def chain_counts(metrics: dict[str, Any]) -> dict[int, tuple[int, int]]:
    """(successes, attempts) per length of the reference's chain of calls, from a summary's
    `successes_calls_N` and `checked_attempts_calls_N` (`mcprl.collect.by_chain_length`)."""
    out = {}
    for key, value in metrics.items():
        if key.startswith("successes_calls_"):
            n = int(key.rsplit("_", 1)[1])
            checked = metrics.get(f"checked_attempts_calls_{n}")
            if checked is not None:
                out[n] = (round(value), round(checked))
    return dict(sorted(out.items()))


def describe_chains(metrics: dict[str, Any]) -> str | None:
    """ "1 call 9 of 14, 2 calls 0 of 4, 3 calls 0 of 6": success by chain length."""
    chains = chain_counts(metrics)
    if not chains:
        return None
    return ", ".join(f"{n} call{'' if n == 1 else 's'} {k} of {m}" for n, (k, m) in chains.items())


def describe_yes_no(metrics: dict[str, Any]) -> str | None:
    """ "2 of 6 (always the same answer: 4)": successes on the yes/no questions beside what the
    better constant answer scores on them (`mcprl.collect.yes_no_against_constant`)."""
    if "constant_yes_no" not in metrics:
        return None
    return (
        f"{metrics['successes_yes_no']:.0f} of {metrics['checked_attempts_yes_no']:.0f} "
        f"(always the same answer: {metrics['constant_yes_no']:.0f})"
    )
