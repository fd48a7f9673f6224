"""Reading the judge's reply: find the JSON, validate it, match scores to ids.

Nothing is repaired silently: a score outside [0, 1], a missing, duplicate or unknown id, or a
non-numeric score is reported as a problem, and the judge is asked again.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = ["RawScore", "extract_json", "validate_scores"]

_FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.DOTALL)


class RawScore(BaseModel):
    model_config = ConfigDict(extra="ignore")
    trajectory_id: str
    explanation: str
    score: float


def _candidates(text: str) -> list[Any]:
    """Every JSON object or array found in the text, in order, without overlaps."""
    decoder = json.JSONDecoder()
    found, i = [], 0
    while i < len(text):
        if text[i] in "{[":
            try:
                obj, end = decoder.raw_decode(text, i)
            except json.JSONDecodeError:
                i += 1
                continue
            found.append(obj)
            i = end
        else:
            i += 1
    return found


def _looks_like_scores(obj: Any) -> bool:
    if isinstance(obj, dict):
        return isinstance(obj.get("scores"), list)
    return isinstance(obj, list) and bool(obj) and all(isinstance(x, dict) for x in obj)


def extract_json(
    text: str, accept: Callable[[Any], bool] | None = None, what: str = "a 'scores' list"
) -> tuple[Any | None, str | None]:
    """Return (object, None) or (None, problem). Recovers fenced or prose-wrapped JSON.

    `accept` says which JSON values are candidates (default: a scores reply); when several
    different candidates are found the reply is ambiguous and nothing is returned.
    """
    accept = accept or _looks_like_scores
    stripped = text.strip()
    try:
        return json.loads(stripped), None
    except json.JSONDecodeError:
        pass
    blocks = [b for b in _FENCE.findall(text) if b.strip()]
    for pool in (blocks, [text]):
        found = [c for chunk in pool for c in _candidates(chunk) if accept(c)]
        distinct = {json.dumps(c, sort_keys=True) for c in found}
        if len(distinct) == 1:
            return found[0], None
        if len(distinct) > 1:
            return None, f"the reply contains {len(distinct)} different JSON values with {what}"
    if not stripped:
        return None, "the reply was empty"
    return None, f"no JSON object with {what} was found in the reply"


def validate_scores(obj: Any, expected_ids: list[str]) -> tuple[dict[str, RawScore], list[str]]:
    """Match scores to ids. Returns (scores by id, problems); problems empty means valid."""
    items = obj.get("scores") if isinstance(obj, dict) else obj
    if not isinstance(items, list):
        return {}, ['the JSON must be an object with a "scores" list']
    problems: list[str] = []
    by_id: dict[str, RawScore] = {}
    expected = set(expected_ids)
    for n, item in enumerate(items):
        if not isinstance(item, dict):
            problems.append(f"scores[{n}] is not an object")
            continue
        tid = item.get("trajectory_id", item.get("id"))
        tid = str(tid).strip() if tid is not None else None
        score = item.get("score")
        if tid is None:
            problems.append(f"scores[{n}] has no trajectory_id")
            continue
        if tid not in expected:
            problems.append(f"unknown trajectory_id {tid!r} (valid ids: {', '.join(expected_ids)})")
            continue
        if tid in by_id:
            problems.append(f"trajectory_id {tid!r} is scored more than once")
            continue
        if isinstance(score, bool) or not isinstance(score, (int, float)):
            problems.append(f"the score for {tid!r} is not a number: {score!r}")
            continue
        if math.isnan(score) or not 0.0 <= score <= 1.0:
            problems.append(f"the score for {tid!r} is {score}, outside [0, 1]")
            continue
        explanation = item.get("explanation", item.get("reasoning", ""))
        by_id[tid] = RawScore(trajectory_id=tid, explanation=str(explanation), score=float(score))
    missing = [i for i in expected_ids if i not in by_id and not _mentioned(i, problems)]
    if missing:
        problems.append(f"no score for trajectory_id {', '.join(repr(m) for m in missing)}")
    return by_id, problems


def _mentioned(tid: str, problems: list[str]) -> bool:
    return any(f"{tid!r}" in p and "unknown" not in p for p in problems)
