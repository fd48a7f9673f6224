"""Turning a group of trajectories into the judge's prompt.

- Identical trajectories are judged once (their verdict is shared afterwards).
- Messages every attempt shares at the start are sent once, as context.
- Each attempt is fenced with a tag that carries a nonce derived from the group's content, so text
  inside an attempt cannot close its own fence or pose as instructions.
- When the prompt exceeds the size budget, the longest tool outputs are cut first, with a marker.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from dataclasses import dataclass

from ruler._rubric import INSTRUCTIONS
from ruler._types import Message, Trajectory
from ruler.errors import PromptTooLargeError

logger = logging.getLogger("ruler")

#: Tool outputs are never cut shorter than this many characters to meet the budget.
MIN_TOOL_CHARS = 200


@dataclass
class Prompt:
    """What is sent to the judge, and how its ids map back to the caller's trajectories."""

    system: str
    user: str
    judge_ids: list[str]  # the id the judge sees for each unique trajectory
    index_of: list[int]  # for each input trajectory, the index of its unique trajectory
    truncated_tool_outputs: int = 0

    def messages(self) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system}, {"role": "user", "content": self.user}]

    @property
    def chars(self) -> int:
        return len(self.system) + len(self.user)


def _canonical(obj: object) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _msg_json(m: Message) -> str:
    return json.dumps(m.model_dump(exclude_none=True), ensure_ascii=False)


def _dedupe(trajectories: list[Trajectory]) -> tuple[list[Trajectory], list[int]]:
    unique: list[Trajectory] = []
    seen: dict[str, int] = {}
    index_of = []
    for t in trajectories:
        key = _canonical(t.model_dump(exclude={"id"}, exclude_none=True))
        if key not in seen:
            seen[key] = len(unique)
            unique.append(t)
        index_of.append(seen[key])
    return unique, index_of


def _common_prefix_len(unique: list[Trajectory]) -> int:
    if len(unique) == 1:
        # A lone trajectory: the context is what came before the agent's first reply.
        msgs = unique[0].messages
        return next((i for i, m in enumerate(msgs) if m.role == "assistant"), len(msgs))
    n = min(len(t.messages) for t in unique)
    for i in range(n):
        first = unique[0].messages[i]
        if any(t.messages[i] != first for t in unique[1:]):
            return i
    return n


def _fence_nonce(unique: list[Trajectory], rubric: str) -> str:
    digest = hashlib.sha256(_canonical([t.model_dump() for t in unique]).encode())
    digest.update(rubric.encode())
    return digest.hexdigest()[:12]


HINT_NOTE = (
    "A hint from the task's author, not seen by the agents: a reference solution. It can be "
    "incomplete or one way among several; use it to check answers, and do not require the same "
    "steps."
)


def _render_user(
    prefix: list[Message],
    tails: list[list[Message]],
    shared_tools: list[dict] | None,
    own_tools: list[list[dict] | None],
    judge_ids: list[str],
    fence: str,
    order: list[int],
    hint: str | None = None,
) -> str:
    parts = [f"<context_{fence}>"]
    parts += [_msg_json(m) for m in prefix] or ["(no shared messages)"]
    parts.append(f"</context_{fence}>")
    if shared_tools:
        parts += [f"<tools_{fence}>", _canonical(shared_tools), f"</tools_{fence}>"]
    if hint:
        parts += [f"<hint_{fence}>", HINT_NOTE, hint, f"</hint_{fence}>"]
    for u in order:
        parts.append(f'<trajectory_{fence} id="{judge_ids[u]}">')
        if own_tools[u]:
            parts.append(_canonical({"tools_offered": own_tools[u]}))
        parts += [_msg_json(m) for m in tails[u]] or ["(no messages after the shared context)"]
        parts.append(f"</trajectory_{fence}>")
    ids = ", ".join(judge_ids[u] for u in order)
    parts.append(
        f"\nScore each of the {len(judge_ids)} trajectories (ids: {ids}) following the rubric. "
        "Reply with the JSON object only."
    )
    return "\n".join(parts)


def _cut(text: str, keep: int, role: str) -> str:
    cut = len(text) - keep
    what = "tool output" if role == "tool" else f"{role} message"
    return f"{text[:keep]}\n…[{what} truncated by ruler: {cut} of {len(text)} characters cut]"


def presentation_order(n: int, key: str, seed: int | None, reverse: bool = False) -> list[int]:
    """The order in which `n` attempts are shown: seeded by `seed` and the group (`key`), so the
    same group is shown the same way each time (and its verdict can be cached), and no attempt
    keeps a place by where it came in the group; None keeps the given order. `reverse` shows
    the same order backwards (a second pass, against position bias)."""
    order = list(range(n))
    if seed is not None:
        random.Random(f"{seed}:{key}").shuffle(order)
    return order[::-1] if reverse else order


def build_prompt(
    trajectories: list[Trajectory],
    rubric: str,
    max_chars: int | None = None,
    *,
    shuffle_seed: int | None = None,
    reverse: bool = False,
    hint: str | None = None,
) -> Prompt:
    """The judge's prompt for a group. Attempts are shown in `presentation_order` and numbered
    1.. in the order shown; `hint` (a reference solution) is shown to the judge, marked as such.
    """
    unique, index_of = _dedupe(trajectories)
    plen = _common_prefix_len(unique)
    prefix = list(unique[0].messages[:plen])
    tails = [list(t.messages[plen:]) for t in unique]
    tool_sets = [t.tools for t in unique]
    shared_tools = tool_sets[0] if all(ts == tool_sets[0] for ts in tool_sets) else None
    own_tools = [None if shared_tools is not None else ts for ts in tool_sets]
    fence = _fence_nonce(unique, rubric)
    order = presentation_order(len(unique), fence, shuffle_seed, reverse)
    judge_ids = [""] * len(unique)  # per unique attempt: its number as shown
    for shown, u in enumerate(order):
        judge_ids[u] = str(shown + 1)
    system = INSTRUCTIONS.format(rubric=rubric, fence=fence)

    def render(cap: int | None, roles: frozenset[str] = _TOOL) -> str:
        def fit(msgs: list[Message]) -> list[Message]:
            if cap is None:
                return msgs
            return [
                m.model_copy(update={"content": _cut(m.content, cap, m.role)})
                if m.role in roles and m.content and len(m.content) > cap
                else m
                for m in msgs
            ]

        return _render_user(
            fit(prefix),
            [fit(t) for t in tails],
            shared_tools,
            own_tools,
            judge_ids,
            fence,
            order,
            hint,
        )

    user = render(None)
    truncated = 0
    if max_chars is not None and len(system) + len(user) > max_chars:
        budget = max_chars - len(system)
        # tool outputs are cut first; then, if that is not enough, the longest messages of any kind
        user, truncated = _fit_budget(render, prefix, tails, budget, _TOOL)
        if len(user) > budget:
            user, truncated = _fit_budget(render, prefix, tails, budget, _ANY)
        if len(user) > budget:
            raise PromptTooLargeError(
                f"the group's judge prompt is {len(system) + len(user)} characters even with "
                f"every message cut to {MIN_TOOL_CHARS}, over max_prompt_chars ({max_chars}); "
                "raise max_prompt_chars or judge fewer, shorter attempts"
            )
        logger.info("ruler: over the size budget; cut %d messages", truncated)
    return Prompt(system, user, judge_ids, index_of, truncated)


_TOOL = frozenset({"tool"})
_ANY = frozenset({"system", "developer", "user", "assistant", "tool"})


def _fit_budget(render, prefix, tails, budget: int, roles: frozenset[str]) -> tuple[str, int]:
    """The largest cap on the length of `roles`' messages that fits the budget (water-filling),
    and how many messages it cuts."""
    lengths = [
        len(m.content) for msgs in [prefix, *tails] for m in msgs if m.role in roles and m.content
    ]
    longest = max(lengths, default=0)
    cap = MIN_TOOL_CHARS
    if longest > MIN_TOOL_CHARS and len(render(MIN_TOOL_CHARS, roles)) <= budget:
        lo, hi = MIN_TOOL_CHARS, longest  # render(lo) fits, render(hi) does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if len(render(mid, roles)) <= budget else (lo, mid)
        cap = lo
    return render(cap, roles), sum(1 for n in lengths if n > cap)
