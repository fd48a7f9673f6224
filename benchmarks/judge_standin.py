"""A judge stand-in: an OpenAI-compatible endpoint that scores RULER's prompts the way a
competent LLM judge would, for measuring RULER-driven training without an API key.

    python benchmarks/judge_standin.py scenarios/calculator.jsonl --port 8100 --error-rate 0.1
    mcprl train example:calculator --reward ruler --judge openai/standin \\
        --judge-api-base http://127.0.0.1:8100/v1

It reads the prompt `ruler` builds (the shared context, then each attempt in its fence), finds
the scenario whose task the context holds, and scores each attempt:

- 0.95 when its final answer is right (`mcprl.rewards.answer_matches` against the scenario's
  reference: the stand-in knows the answers, as a strong judge would work them out);
- 0.30 when it called a tool the reference calls, without a right answer (progress);
- 0.05 otherwise;

and with probability `error_rate` a score is drawn uniformly from [0, 1] instead (the judge
errs). Draws are seeded by `seed` and the prompt, so the same group gets the same scores. It
answers in RULER's JSON (`{"scores": [{"trajectory_id", "explanation", "score"}]}`), so it
exercises `ruler`'s parsing, pairing and caching exactly as a real judge does. A prompt whose
task matches no scenario gets 0.05 for every attempt (and is counted in `unknown`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mcprl.rewards import answer_matches  # noqa: E402
from mcprl.scenarios import Scenario, ScenarioSet  # noqa: E402

RIGHT, PROGRESS, NOTHING = 0.95, 0.30, 0.05
_CONTEXT = re.compile(r"<context_([0-9a-f]+)>\n(.*?)\n</context_\1>", re.S)


class StandinJudge:
    """Scores RULER prompts against known scenarios (module docstring)."""

    def __init__(self, scenarios: ScenarioSet, *, error_rate: float = 0.1, seed: int = 0):
        self.scenarios = [s for s in scenarios if s.reference is not None]
        self.error_rate, self.seed = error_rate, seed
        self.stats = {"groups": 0, "attempts": 0, "right": 0, "progress": 0, "random": 0,
                      "unknown": 0}  # fmt: skip

    def _scenario(self, context: str) -> Scenario | None:
        found = [s for s in self.scenarios if s.task in context]
        return max(found, key=lambda s: len(s.task)) if found else None

    def score_prompt(self, user: str) -> dict[str, Any]:
        """RULER's reply to the prompt `user`: a score for every trajectory in it."""
        match = _CONTEXT.search(user)
        fence, context = (match.group(1), match.group(2)) if match else ("", "")
        pattern = re.compile(
            rf'<trajectory_{fence} id="([^"]+)">\n(.*?)\n</trajectory_{fence}>', re.S
        )
        attempts = pattern.findall(user)
        rng = random.Random(f"{self.seed}:{hashlib.sha256(user.encode()).hexdigest()}")
        scenario = self._scenario(context) or next(
            (s for _, body in attempts[:1] if (s := self._scenario(body))), None
        )
        self.stats["groups"] += 1
        if scenario is None:
            self.stats["unknown"] += 1
        scores = []
        for trajectory_id, body in attempts:
            score, why = self._score(scenario, _messages(body))
            if rng.random() < self.error_rate:
                score, why = round(rng.random(), 2), "(a random score: the judge erred)"
                self.stats["random"] += 1
            self.stats["attempts"] += 1
            scores.append({"trajectory_id": trajectory_id, "explanation": why, "score": score})
        return {"scores": scores}

    def _score(
        self, scenario: Scenario | None, messages: list[dict[str, Any]]
    ) -> tuple[float, str]:
        if scenario is None or scenario.reference is None:
            return NOTHING, "the task is unknown to the stand-in"
        answer, called = _answer_and_tools(messages)
        if answer is not None and answer_matches(answer, scenario.reference):
            self.stats["right"] += 1
            return RIGHT, "the final answer is right"
        if called & {c.tool for c in scenario.reference.calls}:
            self.stats["progress"] += 1
            return PROGRESS, "it called a tool the task needs, but the answer is not right"
        return NOTHING, "no right answer and no step toward one"


def _messages(body: str) -> list[dict[str, Any]]:
    out = []
    for line in body.splitlines():
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(item, dict) and "role" in item:
            out.append(item)
    return out


def _answer_and_tools(messages: list[dict[str, Any]]) -> tuple[str | None, set[str]]:
    """The attempt's final answer (its complete_task call's, else its last text) and the tools
    it called."""
    answer, called = None, set()
    for m in messages:
        if m.get("role") != "assistant":
            continue
        for call in m.get("tool_calls") or []:
            fn = call.get("function") or {}
            name = fn.get("name")
            if name == "complete_task":
                args = fn.get("arguments")
                if isinstance(args, str):
                    try:
                        args = json.loads(args)
                    except json.JSONDecodeError:
                        args = {"answer": args}
                if isinstance(args, dict):
                    value = args.get("answer", args.get("summary"))
                    answer = None if value is None else str(value)
            elif name:
                called.add(name)
        if m.get("content") and answer is None:
            answer = str(m["content"])
    return answer, called


def serve(judge: StandinJudge, port: int = 0) -> tuple[ThreadingHTTPServer, str]:
    """Serve `judge` on 127.0.0.1 in a background thread; returns the server and its /v1 URL.

    It speaks OpenAI's chat completions (`openai/`, `hosted_vllm/` model strings, at the /v1
    URL) and Ollama's `/api/chat` (`ollama_chat/`, at the URL without /v1)."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
            user = next((m["content"] for m in reversed(body.get("messages", []))
                         if m.get("role") == "user"), "")  # fmt: skip
            if "trajectories (ids:" not in user:  # a ping ("Reply with OK.")
                content = "OK"
            else:
                content = json.dumps(judge.score_prompt(user))
            if self.path.rstrip("/").endswith("/api/chat"):  # Ollama's own API (ollama_chat/)
                self._send({
                    "model": body.get("model", "standin"), "created_at": "2026-01-01T00:00:00Z",
                    "message": {"role": "assistant", "content": content},
                    "done": True, "done_reason": "stop",
                    "prompt_eval_count": len(user) // 4, "eval_count": len(content) // 4,
                })  # fmt: skip
                return
            reply = {
                "id": "standin", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model", "standin"),
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": content}}],
                "usage": {"prompt_tokens": len(user) // 4, "completion_tokens": len(content) // 4,
                          "total_tokens": (len(user) + len(content)) // 4},
            }  # fmt: skip
            self._send(reply)

        def _send(self, reply: dict[str, Any]) -> None:
            data = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("scenarios", help="the scenario file whose references the stand-in knows")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--error-rate", type=float, default=0.1, help="share of random scores")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    judge = StandinJudge(ScenarioSet.load(args.scenarios), error_rate=args.error_rate,
                         seed=args.seed)  # fmt: skip
    server, url = serve(judge, args.port)
    print(f"judge stand-in at {url} (model name: anything, e.g. openai/standin)", flush=True)
    try:
        while True:
            time.sleep(60)
            print(json.dumps(judge.stats), flush=True)
    except KeyboardInterrupt:
        server.shutdown()


if __name__ == "__main__":
    main()
