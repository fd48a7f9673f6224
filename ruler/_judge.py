"""`Judge`: RULER's relative scoring of a group of trajectories by an LLM.

    judge = Judge("openai/gpt-4.1-mini")
    result = await judge.score([traj_a, traj_b, traj_c])
    result.rewards  # [0.9, 0.2, 0.55], in the order given

The completion function is LiteLLM's `acompletion` unless one is injected: any async callable
taking LiteLLM's keyword arguments and returning a chat completion (object or dict) or a string.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Literal

import anyio
import anyio.lowlevel

from ruler._cache import JudgeCache, cache_key
from ruler._llm import CompletionFn, LLMClient, RetryPolicy
from ruler._parse import extract_json, validate_scores
from ruler._render import Prompt, build_prompt
from ruler._rubric import DEFAULT_RUBRIC
from ruler._types import JudgeResult, JudgeScore, Trajectory, Usage, coerce_trajectory
from ruler.errors import InvalidGroupError, JudgeError, JudgeParseError

__all__ = ["SCORES_SCHEMA", "Judge", "rank_correlation"]

logger = logging.getLogger("ruler")

SCORES_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "scores": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "trajectory_id": {"type": "string"},
                    "explanation": {"type": "string"},
                    "score": {"type": "number", "minimum": 0, "maximum": 1},
                },
                "required": ["trajectory_id", "explanation", "score"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["scores"],
    "additionalProperties": False,
}


def scores_schema(ids: list[str], explanation_max_chars: int | None = None) -> dict[str, Any]:
    """SCORES_SCHEMA narrowed to this group: exactly these ids, one entry each.

    With constrained decoding (vLLM, mcprl's server) even a small local judge then cannot
    invent, drop or misspell an id; `explanation_max_chars` bounds how long it can ramble.
    """
    schema = copy.deepcopy(SCORES_SCHEMA)
    scores = schema["properties"]["scores"]
    scores["items"]["properties"]["trajectory_id"] = {"type": "string", "enum": list(ids)}
    if explanation_max_chars is not None:
        scores["items"]["properties"]["explanation"]["maxLength"] = explanation_max_chars
    scores["minItems"] = scores["maxItems"] = len(ids)
    return schema


class Judge:
    """An LLM judge that scores groups of trajectories relative to each other.

    Args:
        model: a LiteLLM model string, e.g. "openai/gpt-4.1-mini" or "hosted_vllm/Qwen3-32B".
        rubric: what a good attempt is; `DEFAULT_RUBRIC` unless given.
        api_base, api_key, temperature, timeout: passed to the completion function.
        extra_params: any other keyword arguments for the completion function.
        completion_fn: async callable with LiteLLM's `acompletion` signature.
        retry: retries of transient API errors.
        parse_retries: how many times the judge is asked again after an unusable reply.
        cache: True (default location), False/None (off), a path, or a `JudgeCache`.
        max_concurrency: judge calls in flight at once, per event loop.
        max_prompt_chars: size budget of a serialized group; longest tool outputs are cut first.
            "auto" (the default): 120,000 characters, or less where LiteLLM knows the model's
            context window (3 characters a token over 80% of it, leaving room for the reply).
        structured_output: "auto" sends a JSON schema where the provider is known to take one
            (and falls back to instructions if it refuses); "json_schema" always; "instructions"
            never.
        explanation_max_chars: bound each explanation's length in the JSON schema sent (for
            small local judges under constrained decoding, which may otherwise ramble).
        shuffle: show the attempts in an order seeded by `seed` and the group's content, not in
            the order given (LLM judges favour positions; a group's ids still map back).
        seed: the seed of that order.
        price: USD per million (prompt, completion) tokens where LiteLLM has no price.
        passes: 2 judges each group again with the attempts in reverse order and averages the
            two verdicts; `JudgeResult.agreement` then says how well the passes agree.

    `spent` adds up the usage of every group this judge scored (cached ones included, at no
    tokens), for budgets and reports.
    """

    def __init__(
        self,
        model: str,
        *,
        rubric: str = DEFAULT_RUBRIC,
        api_base: str | None = None,
        api_key: str | None = None,
        temperature: float | None = None,
        timeout: float = 180.0,
        extra_params: Mapping[str, Any] | None = None,
        completion_fn: CompletionFn | None = None,
        retry: RetryPolicy | None = None,
        parse_retries: int = 2,
        cache: bool | str | os.PathLike[str] | JudgeCache | None = True,
        max_concurrency: int = 8,
        max_prompt_chars: int | Literal["auto"] | None = "auto",
        structured_output: Literal["auto", "json_schema", "instructions"] = "auto",
        explanation_max_chars: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        passes: int = 1,
        price: tuple[float, float] | None = None,
    ) -> None:
        if passes not in (1, 2):
            raise ValueError(f"passes={passes}: 1, or 2 (the second in reverse order)")
        self.explanation_max_chars = explanation_max_chars
        self.shuffle, self.seed, self.passes = shuffle, seed, passes
        self.spent = Usage()
        self.llm = LLMClient(
            model,
            api_base=api_base,
            api_key=api_key,
            temperature=temperature,
            timeout=timeout,
            extra_params=extra_params,
            completion_fn=completion_fn,
            retry=retry,
            max_concurrency=max_concurrency,
            structured_output=structured_output,
            price=price,
        )
        self.model = model
        self.rubric = rubric
        self.parse_retries = parse_retries
        if max_prompt_chars == "auto":
            window = self.llm.context_window()
            max_prompt_chars = (
                min(DEFAULT_PROMPT_CHARS, int(window * 0.8 * 3))
                if window
                else (DEFAULT_PROMPT_CHARS)
            )
        self.max_prompt_chars = max_prompt_chars
        self.cache = _make_cache(cache)

    def __repr__(self) -> str:
        return f"Judge({self.model!r}, api_base={self.llm.api_base!r})"

    # -- public -------------------------------------------------------------------------------

    async def score(
        self,
        trajectories: Sequence[Any],
        *,
        tools: Sequence[Any] | None = None,
        rubric: str | None = None,
        hint: str | None = None,
        swallow_exceptions: bool = False,
    ) -> JudgeResult | None:
        """Score a group. `hint`: a reference solution shown to the judge, marked as a hint.
        With `swallow_exceptions`, a judge failure returns None (logged)."""
        group = _coerce_group(trajectories, tools)
        try:
            passes = [
                await self._score(group, rubric or self.rubric, hint, reverse=bool(p))
                for p in range(self.passes)
            ]
            return _combine(passes)
        except JudgeError as exc:
            if not swallow_exceptions:
                raise
            logger.warning("ruler: dropping a group of %d: %s", len(group), exc)
            return None

    def score_sync(self, trajectories: Sequence[Any], **kwargs: Any) -> JudgeResult | None:
        """`score` for scripts without an event loop."""
        return run_sync(partial(self.score, trajectories, **kwargs))

    # -- internals ------------------------------------------------------------------------------

    async def _score(
        self, group: list[Trajectory], rubric: str, hint: str | None, reverse: bool
    ) -> JudgeResult:
        prompt = build_prompt(
            group,
            rubric,
            self.max_prompt_chars,
            shuffle_seed=self.seed if self.shuffle else None,
            reverse=reverse,
            hint=hint,
        )
        request = self.llm.request(prompt.messages())
        key = None
        if self.cache is not None:
            key = cache_key({k: v for k, v in request.items() if k not in _NOT_IN_KEY})
            hit = await self.cache.get(key)
            if hit is not None:
                logger.debug("ruler: cache hit for a group of %d", len(group))
                return _result(group, prompt, hit, Usage(cached=True), self.model)
        usage = Usage()
        try:
            verdict = await self._ask_until_valid(request, prompt, usage)
        finally:
            self.spent.merge(usage)  # a failed group's calls cost as much
        if key is not None:
            await self.cache.put(key, verdict)
        return _result(group, prompt, verdict, usage, self.model)

    async def _ask_until_valid(
        self, request: dict[str, Any], prompt: Prompt, usage: Usage
    ) -> dict[str, dict[str, Any]]:
        request = copy.deepcopy(request)
        reply, problems = "", []
        for asked in range(self.parse_retries + 1):
            reply = await self.llm.complete(
                request,
                usage,
                schema=scores_schema(prompt.judge_ids, self.explanation_max_chars),
                schema_name="ruler_scores",
            )
            obj, problem = extract_json(reply)
            if obj is not None:
                by_id, problems = validate_scores(obj, prompt.judge_ids)
                if not problems:
                    return {tid: s.model_dump() for tid, s in by_id.items()}
            else:
                problems = [problem or "unreadable reply"]
            logger.info("ruler: unusable judge reply (%s); asked %d time(s)", problems, asked + 1)
            request["messages"] = [
                *request["messages"],
                {"role": "assistant", "content": reply},
                {"role": "user", "content": _reask(problems, prompt.judge_ids)},
            ]
        raise JudgeParseError(
            f"judge {self.model!r} gave no valid scores after {self.parse_retries + 1} replies: "
            + "; ".join(problems),
            raw_reply=reply,
            problems=problems,
        )


# the prompt budget where the judge's context window is unknown or larger
DEFAULT_PROMPT_CHARS = 120_000

# request fields that do not change the verdict
_NOT_IN_KEY = ("api_key", "timeout", "max_retries", "num_retries")


def _make_cache(cache: bool | str | os.PathLike[str] | JudgeCache | None) -> JudgeCache | None:
    if cache is None or cache is False:
        return None
    if cache is True:
        return JudgeCache()
    if isinstance(cache, JudgeCache):
        return cache
    return JudgeCache(Path(cache))


def _coerce_group(trajectories: Sequence[Any], tools: Sequence[Any] | None) -> list[Trajectory]:
    if isinstance(trajectories, (str, bytes, Mapping)) or not isinstance(trajectories, Sequence):
        raise InvalidGroupError(
            f"a group must be a list of trajectories, got {type(trajectories).__name__}"
        )
    if len(trajectories) < 2:
        raise InvalidGroupError(
            f"a group needs at least 2 trajectories to compare, got {len(trajectories)} "
            "(RULER ranks attempts at the same task against each other; 4-8 work well)"
        )
    group = [coerce_trajectory(t, i) for i, t in enumerate(trajectories)]
    if tools:
        shared = coerce_trajectory({"messages": [], "tools": list(tools)}, 0).tools
        group = [t if t.tools else t.model_copy(update={"tools": shared}) for t in group]
    ids = [t.id for t in group if t.id is not None]
    if len(ids) != len(set(ids)):
        raise InvalidGroupError(f"trajectory ids must be unique within a group, got {ids}")
    return group


def _result(
    group: list[Trajectory], prompt: Prompt, verdict: dict[str, Any], usage: Usage, model: str
) -> JudgeResult:
    scores = []
    for i, traj in enumerate(group):
        v = verdict[prompt.judge_ids[prompt.index_of[i]]]
        scores.append(
            JudgeScore(
                trajectory_id=traj.id if traj.id is not None else str(i + 1),
                score=v["score"],
                explanation=v["explanation"],
            )
        )
    return JudgeResult(scores=scores, usage=usage, judge=model)


def _combine(passes: list[JudgeResult]) -> JudgeResult:
    """One verdict from the passes over a group: the mean score of each attempt, the
    explanations side by side, the usage added up, and the passes' rank agreement."""
    if len(passes) == 1:
        only = passes[0]
        return only.model_copy(update={"passes": [only.rewards]})
    usage = Usage(cached=all(p.usage.cached for p in passes))
    for p in passes:
        usage.merge(p.usage)
    scores = [
        JudgeScore(
            trajectory_id=parts[0].trajectory_id,
            score=sum(s.score for s in parts) / len(parts),
            explanation=" | ".join(f"pass {i + 1}: {s.explanation}" for i, s in enumerate(parts)),
        )
        for parts in zip(*(p.scores for p in passes), strict=True)
    ]
    rewards = [p.rewards for p in passes]
    return JudgeResult(
        scores=scores,
        usage=usage,
        judge=passes[0].judge,
        passes=rewards,
        agreement=rank_correlation(rewards[0], rewards[1]),
    )


def rank_correlation(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Spearman's rank correlation of two score lists (ties share their mean rank); None
    where either list has all scores equal (no order to agree on)."""
    ra, rb = _ranks(a), _ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    va = sum((x - ma) ** 2 for x in ra)
    vb = sum((y - mb) ** 2 for y in rb)
    if va == 0 or vb == 0:
        return None
    return sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True)) / (va * vb) ** 0.5


def _ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks


def _reask(problems: list[str], ids: list[str]) -> str:
    listed = "\n".join(f"- {p}" for p in problems)
    return (
        f"Your reply could not be used:\n{listed}\n"
        f"Reply again with only the JSON object, with exactly one entry for each trajectory id "
        f"({', '.join(ids)}) and a score between 0 and 1."
    )


def run_sync(fn: Callable[[], Awaitable[Any]]) -> Any:
    """Run a coroutine function from synchronous code (not from inside an event loop)."""
    try:
        anyio.lowlevel.current_token()
    except Exception:
        return anyio.run(fn)
    raise RuntimeError("ruler's *_sync helpers cannot run inside an event loop; use `await`")
