"""The public surface: explicit `__all__`, and `import ruler` stays light."""

from __future__ import annotations

import subprocess
import sys

import pytest

import mcprl
import ruler


@pytest.mark.parametrize("package", [ruler, mcprl], ids=lambda p: p.__name__)
def test_all_names_exist_and_nothing_public_is_unlisted(package):
    for name in package.__all__:
        assert hasattr(package, name), name
    public = {n for n in vars(package) if not n.startswith("_")}
    modules = {n for n in public if type(getattr(package, n)).__name__ == "module"}
    unlisted = public - set(package.__all__) - modules - {"annotations"}
    assert not unlisted, f"public but not in __all__: {sorted(unlisted)}"


def test_import_ruler_does_not_import_torch_mcprl_or_litellm():
    code = (
        "import sys, ruler, ruler.cli;"
        "bad = [m for m in ('torch', 'mcprl', 'litellm', 'transformers') if m in sys.modules];"
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- ART's names ---------------------------------------------------------------------------


def test_trajectory_takes_arts_messages_and_choices():
    from openai.types.chat.chat_completion import ChatCompletion

    from mcprl import Trajectory

    t = Trajectory(messages_and_choices=[{"role": "user", "content": "Hi"}], reward=0)
    reply = ChatCompletion.model_validate({
        "id": "c", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "Hello"},
                     "token_ids": [7, 8], "prompt_token_ids": [1, 2, 3],
                     "mcprl": {"token_logprobs": [-0.1, -0.2], "model_logprobs": [-0.1, -0.2]}}],
    })  # fmt: skip
    t.messages_and_choices.append(reply.choices[0])
    assert t.messages() == [{"role": "user", "content": "Hi"},
                            {"role": "assistant", "content": "Hello"}]  # fmt: skip
    assert t.messages == t.messages()  # still the list it always was
    (choice,) = t.choices
    assert choice.message_index == 1 and choice.token_ids == [7, 8] and t.trainable
    again = Trajectory.model_validate_json(t.model_dump_json())
    assert again.messages() == t.messages() and again.choices == t.choices
    with pytest.raises(TypeError, match="message dict or a completion's choice"):
        t.messages_and_choices.append(42)


@pytest.mark.anyio
async def test_groups_from_awaitables_are_gathered_with_their_failures():
    from mcprl import Trajectory, TrajectoryGroup, gather_trajectory_groups

    async def attempt(i: int) -> Trajectory:
        if i == 2:
            raise RuntimeError("tool server down")
        return Trajectory(reward=float(i))

    groups = await gather_trajectory_groups(
        (TrajectoryGroup(attempt(i) for i in range(3)) for _ in range(2)),
        pbar_desc="gather",
        max_exceptions=2,
        progress=False,
    )
    assert [len(g) for g in groups] == [2, 2]
    assert sorted(t.reward for t in groups[0].trajectories) == [0.0, 1.0]
    assert groups[0].exceptions[0].message == "tool server down"
    single = await TrajectoryGroup([Trajectory(reward=1.0), attempt(0)])
    assert [t.reward for t in single.trajectories] == [1.0, 0.0] and not single.pending


@pytest.mark.anyio
async def test_ruler_score_group_sets_rewards_or_returns_none():
    from mcprl import Trajectory, TrajectoryGroup, ruler_score_group
    from ruler import Judge
    from tests.helpers import ScriptedJudge, by_content

    def group() -> TrajectoryGroup:
        return TrajectoryGroup(trajectories=[
            Trajectory(messages=[{"role": "user", "content": "2+2?"},
                                 {"role": "assistant", "content": answer}], reward=0.5)
            for answer in ("4", "5")
        ])  # fmt: skip

    rule = by_content(lambda text: 0.0 if "5" in text else 1.0)
    judge = Judge("openai/j", completion_fn=ScriptedJudge(rule), cache=False)
    scored = await ruler_score_group(group(), judge, debug=True)
    first, second = scored.trajectories
    assert first.reward > second.reward
    assert (
        first.metrics["independent_reward"] == 0.5 and first.metrics["ruler_score"] == first.reward
    )
    assert first.logs and first.logs[0].startswith("RULER (openai/j)")
    failing = Judge("openai/j", completion_fn=ScriptedJudge("not json"), cache=False,
                    parse_retries=0)  # fmt: skip
    assert await ruler_score_group(group(), failing, swallow_exceptions=True) is None
    with pytest.raises(ValueError, match="2 or more"):
        await ruler_score_group(TrajectoryGroup(trajectories=[Trajectory()]), judge)
