"""Small real doubles used across tests: a scripted judge function and a local chat endpoint."""

from __future__ import annotations

import importlib.util
import json
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from mcprl.scenarios import Reference, ReferenceCall, Scenario

# "What is the average of 23, 38 and 86?": a chain of three calls, each fed by the one before
AVERAGE = Scenario(
    id="avg",
    task="What is the average of 23, 38 and 86?",
    difficulty=4,
    reference=Reference(
        answer="49",
        calls=[
            {"tool": "add", "arguments": {"a": 23, "b": 38}},
            {"tool": "add", "arguments": {"a": 61, "b": 86}},
            {"tool": "divide", "arguments": {"a": 147, "b": 3}},
        ],
    ),
)

_ID = re.compile(r'<trajectory_[0-9a-f]+ id="([^"]+)">')


def solved_scenario(
    sid: str, calls: list[tuple[str, dict, str]], answer: str, split: str = "train"
) -> Scenario:
    """A scenario with reference `calls` (tool, arguments, result) and `answer`."""
    refs = [ReferenceCall(tool=t, arguments=a, result=r) for t, a, r in calls]
    return Scenario(id=sid, task=f"Task {sid}?", difficulty=len(calls), split=split,
                    reference=Reference(answer=answer, calls=refs))  # fmt: skip


def judge_ids(messages: list[dict[str, Any]]) -> list[str]:
    """The trajectory ids a judge prompt shows, in order."""
    return _ID.findall(messages[1]["content"])


def scores_reply(scores: dict[str, float], order: list[str] | None = None) -> str:
    order = order or list(scores)
    items = [{"trajectory_id": i, "explanation": f"e{i}", "score": scores[i]} for i in order]
    return json.dumps({"scores": items})


class ScriptedJudge:
    """An async completion function that answers from a script and records every request.

    `script` is a list of replies (strings, exceptions to raise, or callables taking the request
    kwargs), used in order; the last one repeats.
    """

    def __init__(self, *script: Any) -> None:
        self.script = list(script)
        self.requests: list[dict[str, Any]] = []

    async def __call__(self, **kwargs: Any) -> Any:
        self.requests.append(kwargs)
        step = self.script[min(len(self.requests), len(self.script)) - 1]
        if isinstance(step, BaseException):
            raise step
        if callable(step):
            step = step(kwargs)
        return step

    @property
    def calls(self) -> int:
        return len(self.requests)


def by_content(rule: Callable[[str], float]) -> Callable[[dict[str, Any]], str]:
    """A reply that scores each shown trajectory by a rule over its text, ids in reverse order."""

    def reply(kwargs: dict[str, Any]) -> str:
        text = kwargs["messages"][1]["content"]
        ids = judge_ids(kwargs["messages"])
        scores = {}
        for tid in ids:
            body = text.split(f'id="{tid}">', 1)[1].split("</trajectory_", 1)[0]
            scores[tid] = rule(body)
        return scores_reply(scores, order=list(reversed(ids)))

    return reply


class LocalChatServer:
    """A minimal OpenAI-compatible `/v1/chat/completions` endpoint on 127.0.0.1, in a thread.

    `respond(body) -> (status, json)` decides each answer; requests are recorded.
    """

    def __init__(self, respond: Callable[[dict[str, Any]], tuple[int, dict[str, Any]]]) -> None:
        self.respond = respond
        self.requests: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(body)
                status, payload = server.respond(body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> LocalChatServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def chat_completion(content: str, model: str = "local-judge") -> dict[str, Any]:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
    }


# -- MCP servers -----------------------------------------------------------------------------

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "servers"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def served(name: str, *, python: str = sys.executable, transport: str = "http") -> Iterator[str]:
    """Run an example server over HTTP (or SSE) on 127.0.0.1 in a subprocess; yield its URL."""
    port = free_port()
    proc = subprocess.Popen(
        [python, str(EXAMPLES / f"{name}.py"), f"--{transport}", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                err = proc.stderr.read().decode() if proc.poll() is not None else ""
                raise RuntimeError(f"example server {name} did not start: {err[-2000:]}")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/{'sse' if transport == 'sse' else 'mcp'}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stderr.close()


def load_example(name: str) -> Any:
    """Import an example server module, for in-process sessions."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FRAGILE_SERVER = f"""
import os, sys
sys.path.insert(0, {str(EXAMPLES)!r})
from _compat import make_server, serve
server = make_server("fragile", "dies on request")

@server.tool()
def crash() -> str:
    \"\"\"Exit the process at once, after a last word on stderr.\"\"\"
    print("segfault in module foo", file=sys.stderr, flush=True)
    os._exit(1)

@server.tool()
def echo(text: str) -> str:
    \"\"\"Return the text.\"\"\"
    return text

serve(server)
"""


def fragile_server(tmp_path: Path) -> str:
    """A stdio server spec whose `crash` tool kills it mid-session."""
    path = tmp_path / "fragile.py"
    path.write_text(FRAGILE_SERVER)
    return f"{sys.executable} {path}"
