"""What the engine keeps of finished replies for a conversation's next turn (`ConversationCache`)
during `mcprl train`, with the agent loop telling mcprl's server that an answer ends the
conversation (`final_tools`, the default) and without (the server keeps every reply), each in a
fresh process, in one run.

    python benchmarks/kept_replies.py [-- train example:calculator --steps 1 --eval-every 0
                                          --no-report --seed 5]

Per mode: the most bytes and replies the cache held, the mean kept reply, replies continued by a
next turn and replies forgotten without one, the process's peak RSS and the run's own timing line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

DEFAULT = ["train", "example:calculator", "--steps", "1", "--eval-every", "0", "--no-report",
           "--seed", "5"]  # fmt: skip

PROBE = """
import json, resource, sys, time
from mcprl.serving import LocalServer, _prefix

if sys.argv[1] == "keep-all":
    LocalServer.extensions = ()  # the loop then never sends final_tools
cache = _prefix.ConversationCache
add, find, remove = cache.add, cache.find, cache._remove
seen = {"adds": 0, "peak_bytes": 0, "peak_entries": 0, "entry_bytes": 0}
continued, ended = set(), {"continued": 0, "never": 0}

def counted_add(self, adapter, entry):
    add(self, adapter, entry)
    seen["adds"] += 1
    seen["entry_bytes"] += _prefix._nbytes(entry.own)
    if self.bytes > seen["peak_bytes"]:
        seen["peak_bytes"], seen["peak_entries"] = self.bytes, len(self.entries)

def counted_find(self, adapter, prompt):
    hit = find(self, adapter, prompt)
    if hit is not None:
        continued.add(id(hit))
    return hit

def counted_remove(self, key):
    ended["continued" if id(self.entries[key]) in continued else "never"] += 1
    remove(self, key)

cache.add, cache.find, cache._remove = counted_add, counted_find, counted_remove
from mcprl.cli import main
started = time.perf_counter()
code = main(sys.argv[3:])
seen.update(ended, wall_s=time.perf_counter() - started,
            peak_rss_gb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)
with open(sys.argv[2], "w") as f:
    json.dump(seen, f)
sys.exit(code)
"""


def run(mode: str, argv: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/seen.json"
        done = subprocess.run(
            [sys.executable, "-c", PROBE, mode, out, *argv, "--path", f"{tmp}/runs", "-q"],
            capture_output=True, text=True,
        )  # fmt: skip
        if done.returncode:
            raise SystemExit(f"{mode}: exited {done.returncode}\n{done.stderr[-2000:]}")
        seen = json.loads(Path(out).read_text())
    seen["time"] = next((x.strip() for x in done.stdout.splitlines() if "time:" in x), "")
    return seen


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="write the results here as JSON")
    p.add_argument("argv", nargs="*", default=DEFAULT, help="the mcprl command, after --")
    args = p.parse_args()
    rows = {mode: run(mode, args.argv) for mode in ("final-tools", "keep-all")}
    print(f"mcprl {' '.join(args.argv)}\n")
    print("| mode | peak kept | replies then | mean reply | continued | never continued "
          "| peak RSS | time |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for mode, r in rows.items():
        mean = r["entry_bytes"] / max(r["adds"], 1)
        print(f"| {mode} | {r['peak_bytes'] / 1e6:.0f} MB | {r['peak_entries']} | "
              f"{mean / 1e6:.1f} MB | {r['continued']} | {r['never']} | "
              f"{r['peak_rss_gb']:.2f} GB | {r['time']} |")  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": args.argv, "runs": rows}, f, indent=1)


if __name__ == "__main__":
    main()
