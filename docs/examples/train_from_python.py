"""Train from Python, with ART's client names: register a model on a backend, roll out groups
of attempts over MCP, score them against the scenarios' references, and train.

    python docs/examples/train_from_python.py [--steps 1] [--path .mcprl]

CI runs this script (tests/test_docs.py), so the documented API cannot break unseen.
"""

from __future__ import annotations

import argparse
import asyncio

import mcprl as art  # ART's client names: TrainableModel, TrajectoryGroup, TrainConfig
from mcprl.backends import LocalBackend
from mcprl.rewards import scorer
from mcprl.rollout import RolloutConfig, rollout
from mcprl.scenarios import ScenarioSet, bundled_scenarios

SERVER = "example:calculator"  # any MCP server: a command line, a URL, or a config file


async def main(steps: int, path: str) -> None:
    scenarios = ScenarioSet.load(bundled_scenarios(SERVER))
    train = scenarios.train.scenarios[:2]
    score = scorer({s.id: s for s in scenarios})  # reference rewards (RULER: add judge=)
    config = RolloutConfig(max_tokens=64)
    with LocalBackend(path=path) as backend:  # engine and trainer in this process
        model = art.TrainableModel(name="agent", project="python-example")
        await model.register(backend)  # resumes the run if it has checkpoints
        for _ in range(steps):
            groups = await art.gather_trajectory_groups(
                (
                    art.TrajectoryGroup(rollout(model, s, SERVER, config) for _ in range(4))
                    for s in train
                ),
                after_each=score,
                max_exceptions=2,
            )
            result = await model.train(groups, config=art.TrainConfig(learning_rate=2e-3))
            rewards = [t.reward for g in groups for t in g.trajectories]
            print(
                f"step {result.step}: {len(rewards)} attempts, mean reward "
                f"{sum(rewards) / len(rewards):.3f}, served as {model.get_inference_name()}"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--path", default=".mcprl", help="where the run is kept")
    args = parser.parse_args()
    asyncio.run(main(args.steps, args.path))
