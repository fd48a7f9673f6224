"""Groups of attempts by a policy at scenarios, over MCP, scored against their references, and
saved as JSON Lines: what a training step collects, without the training.

    python docs/examples/rollouts.py [OUT.jsonl]
"""

from __future__ import annotations

import asyncio
import sys

from mcprl import Model, RolloutConfig, ScenarioSet, gather_groups, rollout, scorer, write_groups
from mcprl.scenarios import bundled_scenarios
from mcprl.serving import LocalServer

SERVER = "example:calculator"


async def main(policy: Model, out: str) -> None:
    scenarios = ScenarioSet.load(bundled_scenarios(SERVER)).val.scenarios[:2]
    config = RolloutConfig(max_turns=4, max_tokens=64)
    groups = await gather_groups(
        [[lambda s=s: rollout(policy, s, SERVER, config) for _ in range(2)] for s in scenarios],
        max_concurrency=4,
        max_exceptions=0.25,  # a count, or a fraction of the attempts
        after_each=scorer({s.id: s for s in scenarios}),  # reference rewards; judge= for RULER
    )
    write_groups(out, groups)
    for group in groups:
        print(group.scenario_id, [t.reward for t in group.trajectories])


if __name__ == "__main__":
    with LocalServer("smollm2-135m") as server:  # or any OpenAI-compatible endpoint
        policy = Model(name="smollm2-135m", base_url=server.base_url, api_key=server.api_key)
        asyncio.run(main(policy, sys.argv[1] if len(sys.argv) > 1 else "calc-val.jsonl"))
