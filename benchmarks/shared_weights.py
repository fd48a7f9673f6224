"""Resident memory of a local backend serving the default model with its run's trainer loaded:
the trainer reading the served model's base weights (`LoraTrainer.share_base_weights`, the
default) against a trainer with a copy of its own, each in a fresh process, in one run.

    python benchmarks/shared_weights.py [--repeats 2]
"""

from __future__ import annotations

import argparse
import subprocess
import sys

PROBE = """
import gc, sys, tempfile, anyio
from mcprl import TrainableModel
from mcprl.backends import LocalBackend
from mcprl._memory import return_freed_memory
from mcprl.training import LoraTrainer

if sys.argv[1] == "copy":
    LoraTrainer.share_base_weights = lambda self, served: 0

def rss_gb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 2**20

async def main():
    with LocalBackend(tempfile.mkdtemp()) as backend:
        await TrainableModel(name="m", project="p").register(backend)
        backend._runs[("p", "m")].trainer  # loaded on first use
        gc.collect()
        return_freed_memory()
        print(f"{rss_gb():.3f}")

anyio.run(main)
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    rows = {"copy": [], "share": []}
    for _ in range(args.repeats):
        for mode in rows:
            out = subprocess.run(
                [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True
            )
            rows[mode].append(float(out.stdout.strip().splitlines()[-1]))
    print("| trainer's base weights | resident (GB), each run |")
    print("| --- | --- |")
    for mode, name in (("copy", "a copy of its own"), ("share", "the served model's")):
        print(f"| {name} | {', '.join(f'{v:.2f}' for v in rows[mode])} |")
    saved = min(rows["copy"]) - max(rows["share"])
    print(f"\nsaved: at least {saved:.2f} GB")


if __name__ == "__main__":
    main()
