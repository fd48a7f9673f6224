"""The policy behind an OpenAI-compatible endpoint, in this process, asked through the official
`openai` client: a tool call under a grammar, with the token data training needs.

    python docs/examples/serve_and_call.py
"""

from __future__ import annotations

import openai

from mcprl.serving import LocalServer

MULTIPLY = {
    "type": "function",
    "function": {
        "name": "multiply",
        "description": "Multiply two numbers: a * b",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
    },
}

with LocalServer("smollm2-135m") as server:  # loads the model; a random API key
    client = openai.OpenAI(base_url=server.base_url, api_key=server.api_key)
    reply = client.chat.completions.create(
        model="smollm2-135m",
        messages=[{"role": "user", "content": "What is 6 times 7?"}],
        tools=[MULTIPLY],
        tool_choice="required",
        n=2,
        seed=1,
        max_tokens=96,
    )
    for choice in reply.choices:
        call = choice.message.tool_calls[0]  # always a valid call of an offered tool
        extra = choice.model_extra
        print(
            f"{call.function.name}({call.function.arguments}): "
            f"{len(extra['token_ids'])} sampled tokens after a prompt of "
            f"{len(extra['prompt_token_ids'])}, log-probabilities "
            f"{[round(x, 2) for x in extra['mcprl']['model_logprobs'][:3]]}..."
        )
