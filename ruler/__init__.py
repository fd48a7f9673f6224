"""RULER: score a group of attempts at the same task relative to each other, with an LLM judge.

    import ruler

    result = await ruler.score_group([traj_a, traj_b], judge="openai/gpt-4.1-mini")
    for s in result.scores:
        print(s.trajectory_id, s.score, s.explanation)

A trajectory is an OpenAI-format message list (dicts, pydantic or OpenAI SDK objects), or an
object with `messages` (and optionally `tools` and `id`). This package depends on LiteLLM and
pydantic only; importing it never imports torch or mcprl.
"""

from __future__ import annotations

from ruler._api import score_group, score_group_sync
from ruler._cache import JudgeCache, default_cache_path
from ruler._judge import SCORES_SCHEMA, Judge
from ruler._llm import CompletionFn, LLMClient, RetryPolicy
from ruler._parse import extract_json
from ruler._rubric import DEFAULT_RUBRIC
from ruler._types import JudgeResult, JudgeScore, Message, Trajectory, Usage
from ruler.errors import (
    InvalidGroupError,
    JudgeAPIError,
    JudgeError,
    JudgeParseError,
    PromptTooLargeError,
    RulerError,
)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_RUBRIC",
    "SCORES_SCHEMA",
    "CompletionFn",
    "InvalidGroupError",
    "Judge",
    "JudgeAPIError",
    "JudgeCache",
    "JudgeError",
    "JudgeParseError",
    "JudgeResult",
    "JudgeScore",
    "LLMClient",
    "Message",
    "PromptTooLargeError",
    "RetryPolicy",
    "RulerError",
    "Trajectory",
    "Usage",
    "__version__",
    "default_cache_path",
    "extract_json",
    "score_group",
    "score_group_sync",
]
