"""Practice tasks for an MCP server's tools: types, files, and two generators.

- `generate_scenarios`: an LLM (any LiteLLM model) writes tasks from the tools and resources.
- `grounded_scenarios`: no LLM; tasks built from the input schemas and checked on the live
  server, with reference calls and answers.
- `reword_tasks`: an LLM rewrites grounded tasks in a user's words; references stay verified.
- `scenarios_for`: what a run trains on when no file is given (curated, LLM-written or
  grounded).
- `hidden_writers`: the tools that may change the server's data and that no task of a set
  calls: the agent is not offered them.
"""

from __future__ import annotations

from mcprl.scenarios._answers import equals_as_written, guessable, polarity, written_precision
from mcprl.scenarios._dedupe import Deduper, normalize
from mcprl.scenarios._grounded import GenerationReport, build_grounded, grounded_scenarios
from mcprl.scenarios._llm import SCENARIOS_SCHEMA, generate_scenarios
from mcprl.scenarios._reword import reword_tasks
from mcprl.scenarios._source import (
    MAX_SCENARIOS,
    MIN_SCENARIOS,
    PER_TOOL,
    grounded_with_notes,
    hidden_writers,
    scenario_count,
    scenarios_for,
)
from mcprl.scenarios._types import (
    AnswerType,
    Reference,
    ReferenceCall,
    Scenario,
    ScenarioSet,
    bundled_scenarios,
    check_named_arguments,
    has_reference,
    named_arguments,
    question_kind,
    same_text,
)

__all__ = [
    "MAX_SCENARIOS",
    "MIN_SCENARIOS",
    "PER_TOOL",
    "SCENARIOS_SCHEMA",
    "AnswerType",
    "Deduper",
    "GenerationReport",
    "Reference",
    "ReferenceCall",
    "Scenario",
    "ScenarioSet",
    "build_grounded",
    "bundled_scenarios",
    "check_named_arguments",
    "equals_as_written",
    "generate_scenarios",
    "grounded_scenarios",
    "grounded_with_notes",
    "guessable",
    "has_reference",
    "hidden_writers",
    "named_arguments",
    "normalize",
    "polarity",
    "question_kind",
    "reword_tasks",
    "same_text",
    "scenario_count",
    "scenarios_for",
    "written_precision",
]
