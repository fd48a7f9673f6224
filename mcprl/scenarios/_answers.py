"""Answers as numbers and values: read off a result and rounded as a person writes them (the
reward checks a number to the precision it is written in: `mcprl.rewards.answer_matches`).

    computed_number("The sum of 31 and 25 is 56.", [31, 25])   -> 56.0
    number_answer(16.404199475065617)                          -> "16.4042"
"""

from __future__ import annotations

import decimal
import math
import re
from typing import Any, Literal

from mcprl.scenarios._dedupe import normalize
from mcprl.scenarios._questions import format_number

__all__ = [
    "ANSWER_KEYS",
    "NUMBER_IN_TEXT",
    "computed_number",
    "equals_as_written",
    "guessable",
    "is_number",
    "number_answer",
    "polarity",
    "rounded",
    "written_precision",
]

ANSWER_KEYS = ("value", "result", "count", "total")

# a number standing alone: not part of a time (04:30), a date (2024-06-01) or a word
NUMBER_IN_TEXT = re.compile(r"(?<![\w.:/-])-?\d+(?:\.\d+)?(?![\w.]*\w)(?![:/-]\d)")


def computed_number(data: Any, arguments: list[Any]) -> float | None:
    """The number a computation returned: the result itself, or the one number in its text
    that is not an argument ("The sum of 31 and 25 is 56." -> 56)."""
    if isinstance(data, list) and len(data) == 1:
        data = data[0]
    if isinstance(data, dict):  # {"table": "fruit", "count": 4}: the count
        data = next((data[k] for k in ANSWER_KEYS if is_number(data.get(k))), None)
    if isinstance(data, (int, float)) and not isinstance(data, bool):
        return data
    if not isinstance(data, str) or len(data) > 200:
        return None
    given = {float(a) for a in arguments if isinstance(a, (int, float)) and not isinstance(a, bool)}
    given |= {float(x) for a in arguments if isinstance(a, str) for x in NUMBER_IN_TEXT.findall(a)}
    new = [float(x) for x in NUMBER_IN_TEXT.findall(data) if float(x) not in given]
    return new[0] if len(new) == 1 else None


def number_answer(value: float) -> str:
    """At most four decimals, or four significant digits below 1 (0.01393)."""
    if not isinstance(value, float) or value == 0:
        return str(value)
    places = 4 if abs(value) >= 1 else 3 - math.floor(math.log10(abs(value)))
    return format_number(round(value, places))


def rounded(answer: str) -> str:
    return number_answer(float(answer)) if is_number(answer) and "." in answer else answer


def is_number(text: Any) -> bool:
    if isinstance(text, bool):
        return False
    try:
        float(text)
    except (TypeError, ValueError):
        return False
    return True


def written_precision(expected: str) -> float | None:
    """Half a unit of the last place `expected` is written to ("32.8854" -> 0.00005; an integer
    -> 0), or None when it is not a finite number."""
    try:
        exponent = decimal.Decimal(expected.strip().replace(",", "")).as_tuple().exponent
    except decimal.InvalidOperation:
        return None
    if not isinstance(exponent, int):  # NaN, Infinity
        return None
    return 0.5 * 10.0**exponent if exponent < 0 else 0.0


def equals_as_written(value: float, expected: str) -> bool:
    """`value` equals the number `expected` to the precision it is written in (an integer
    exactly, "32.8854" to half a unit of its last place), a relative 1e-9 of float noise aside;
    False when `expected` is no number."""
    half_unit = written_precision(expected)
    if half_unit is None:
        return False
    target = float(expected.strip().replace(",", ""))
    return abs(value - target) <= half_unit + 1e-9 * max(1.0, abs(target))


_POLARITY = {"yes": "yes", "true": "yes", "no": "no", "false": "no"}


def polarity(answer: str) -> Literal["yes", "no"] | None:
    """ "yes" or "no" where `answer` is just that (or "true" or "false"), else None."""
    return _POLARITY.get(normalize(answer))  # type: ignore[return-value]


def guessable(answer: str) -> bool:
    """A yes, a no or a 0: an answer a guess hits often enough that only a call for what the
    task names bears it out ("Do I have notes about lisbon?" is 0 from a search of "lisbon",
    and from a search of "lion" too, on a server with no notes)."""
    return polarity(answer) is not None or equals_as_written(0.0, answer)
