"""How long the README's main command takes: ``conductor ask`` as a user runs it, cold and warm.

Each run gets fresh cache and data directories (XDG_CACHE_HOME, XDG_DATA_HOME): the first
``conductor ask --json QUESTION`` there is a first run on a new machine (no llama.cpp prompt
cache, a new trace database), the second one finds the cache. Wall time is measured around the
whole process, model load included; the JSON's ``timings`` say where it went.

Baseline, measured in the same run: a new process that loads the same llama.cpp engine and lets
the local model answer the question alone (one chat completion, no Conductor, no trace), so the
ratio is what orchestrating costs over calling the worker directly.

    python benchmarks/ask_latency.py [--runs 4] [--question "..."]

Prints each run, then medians, the ratio to the baseline and how many runs took over 12 s.
Run it on a quiet machine: two llama.cpp engines sharing the cores slow each other down.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

QUESTION = "A shop sells 3 pens for $4. How much do 12 pens cost?"
TARGET_S = 12.0
ASK = "from conductor_cli import main; main()"
# The local worker alone: the engine the ask uses, one completion of the question.
BARE = """
import asyncio, sys
from conductor.chat import ChatMessage
from conductor_adapters.llamacpp import EngineOptions, get_engine
from conductor_adapters.settings import get_settings

engine = get_engine("builtin:smollm2", EngineOptions.from_settings(get_settings()))
messages = [ChatMessage(role="user", content=sys.argv[1])]
asyncio.run(engine.complete(messages, max_tokens=256, temperature=0.0))
"""


def _timed(args: list[str], env: dict[str, str]) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args[:3])} failed ({done.returncode}): {done.stderr[-2000:]}")
    return wall, done.stdout


def _env(directory: Path) -> dict[str, str]:
    return {
        **os.environ,
        "XDG_CACHE_HOME": str(directory / "cache"),
        "XDG_DATA_HOME": str(directory / "data"),
    }


def ask(question: str, env: dict[str, str]) -> tuple[float, dict[str, Any]]:
    wall, out = _timed([sys.executable, "-c", ASK, "ask", "--json", question], env)
    return wall, json.loads(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--question", default=QUESTION)
    options = parser.parse_args()

    walls: dict[str, list[float]] = {"cold": [], "warm": [], "bare": []}
    print(f"question: {options.question}")
    print("run  kind  wall     rounds  steps  planner calls (ms)   timings (ms)")
    for run in range(1, options.runs + 1):
        with tempfile.TemporaryDirectory(prefix="ask-latency-") as directory:
            env = _env(Path(directory))
            bare, _ = _timed([sys.executable, "-c", BARE, options.question], env)
            walls["bare"].append(bare)
            print(f"{run:<4} bare  {bare:5.2f} s")
            for kind in ("cold", "warm"):
                wall, summary = ask(options.question, env)
                walls[kind].append(wall)
                calls = [round(c["latency_ms"]) for c in summary["planner_calls"]]
                timings = {k.removesuffix("_ms"): v for k, v in summary["timings"].items()}
                print(
                    f"{run:<4} {kind}  {wall:5.2f} s  {len(calls):<7} {len(summary['steps']):<6} "
                    f"{calls!s:<20} {timings}"
                )
    bare_median = statistics.median(walls["bare"])
    print()
    for kind in ("cold", "warm"):
        median = statistics.median(walls[kind])
        over = sum(w > TARGET_S for w in walls[kind])
        print(
            f"{kind}: median {median:.2f} s, range {min(walls[kind]):.2f}-{max(walls[kind]):.2f} s,"
            f" {over} of {len(walls[kind])} over {TARGET_S:g} s; "
            f"{median / bare_median:.2f}x the local model answering alone ({bare_median:.2f} s)"
        )


if __name__ == "__main__":
    main()
