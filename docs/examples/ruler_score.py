"""RULER on one group: two attempts at the same task, scored against each other by an LLM judge.

    python docs/examples/ruler_score.py --judge openai/gpt-4.1-mini      # OPENAI_API_KEY set
    python docs/examples/ruler_score.py --judge openai/smollm2-135m \\
        --api-base http://127.0.0.1:8000/v1 --api-key KEY \\
        --temperature 0 --explanation-max-chars 160           # `mcprl serve`'s model, as training

A small local judge does best greedy and kept brief: sampled, it sometimes rambles past its
token budget or scores one attempt twice (ruler then asks again, up to `parse_retries` times).
"""

from __future__ import annotations

import argparse
import asyncio

import ruler

ATTEMPT_A = [
    {"role": "system", "content": "You have calculator tools."},
    {"role": "user", "content": "What is 6 times 7?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "multiply", "arguments": '{"a": 6, "b": 7}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "42"},
    {"role": "assistant", "content": "6 x 7 = 42"},
]
ATTEMPT_B = [*ATTEMPT_A[:2], {"role": "assistant", "content": "About 40."}]


async def main(args: argparse.Namespace) -> None:
    judge = ruler.Judge(
        args.judge,
        api_base=args.api_base,
        api_key=args.api_key,
        temperature=args.temperature,
        explanation_max_chars=args.explanation_max_chars,
        cache=False,
    )
    result = await judge.score([ATTEMPT_A, ATTEMPT_B])
    for s in result.scores:  # in the order given
        print(s.trajectory_id, s.score, s.explanation)
    print(result.usage)  # tokens, judge calls, cost in USD where LiteLLM knows it


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--judge", required=True, help="a LiteLLM model string")
    parser.add_argument("--api-base", help="an OpenAI-compatible endpoint")
    parser.add_argument("--api-key")
    parser.add_argument("--temperature", type=float, help="the judge's sampling temperature")
    parser.add_argument("--explanation-max-chars", type=int, help="bound each explanation")
    asyncio.run(main(parser.parse_args()))
