"""Defaults that depend on the environment: which LLM to use when the user names none."""

from __future__ import annotations

import os

__all__ = ["configured_llm"]

# Provider keys, in order of preference, and the model used when only the key is set.
_PROVIDERS = (
    ("OPENAI_API_KEY", "openai/gpt-4.1-mini"),
    ("ANTHROPIC_API_KEY", "anthropic/claude-3-5-haiku-latest"),
    ("GEMINI_API_KEY", "gemini/gemini-2.0-flash"),
    ("OPENROUTER_API_KEY", "openrouter/openai/gpt-4.1-mini"),
)


def configured_llm(env_var: str = "MCPRL_GENERATOR") -> str | None:
    """The LLM to use for writing scenarios or judging, if the environment names one.

    `$MCPRL_GENERATOR` (or the given variable) wins; else the first provider whose API key is
    set; else None, and callers fall back to what works offline.
    """
    explicit = os.environ.get(env_var)
    if explicit:
        return explicit
    for key, model in _PROVIDERS:
        if os.environ.get(key):
            return model
    return None
