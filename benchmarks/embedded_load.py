"""The embedded model's loads, each in a fresh process (issues 31 and 43):

    python3 benchmarks/embedded_load.py [--cold] [--repeats 3]

warm: the dequantized copy cached, the whole `load_model` from the process's start (the best of
`--repeats` fresh processes), split by the steps it says (engine/models/load_progress.py): importing
torch and transformers, the config (with it, the model's code: transformers' modules), the weights,
the tokenizer; CPU seconds (user+system, which other jobs on the machine disturb less) and wall seconds.
--cold: into an empty cache, ours (the GGUF's header parsed once) against the straightforward load
(transformers parses the header for the config, the tokenizer, the model's config and its tensors,
and builds gguf's tensor-name table once per submodule), one fresh process each.
Last line: `ratio cold straightforward / ours: X` (with --cold), else `seconds warm load: X`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def probe(straightforward: bool) -> None:
    """Runs in the measured process: one load, its steps' CPU and wall seconds as one JSON line."""
    started = time.perf_counter()
    from engine.models import gguf_cache, loading

    if straightforward:  # every parse transformers makes, as before issue 43
        setattr(loading, "headers_read_once", contextlib.nullcontext)  # noqa: B010  (the name the load calls)
        setattr(gguf_cache, "headers_read_once", contextlib.nullcontext)  # noqa: B010
    steps: dict[str, list[float]] = {}
    last: dict[str, Any] = {"step": "start", "cpu": 0.0, "wall": 0.0}

    def report(text: str) -> None:
        what = text.split("…")[0].split(":")[0]
        if what == last["step"]:
            return  # the heartbeat saying the same step again
        now_cpu, now_wall = cpu(), time.perf_counter() - started
        steps[last["step"]] = [now_cpu - last["cpu"], now_wall - last["wall"]]
        last.update(step=what, cpu=now_cpu, wall=now_wall)

    loading.load_model("smollm2-135m", device="cpu", dtype="float32", report=report)
    report("end")
    print(json.dumps({"cpu": cpu(), "wall": time.perf_counter() - started, "steps": steps}))


def measure(cache: str, straightforward: bool = False) -> dict:
    env = {**os.environ, "ANATOMY_TUI_CACHE": cache, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, __file__, "--probe", *(["--straightforward"] if straightforward else [])]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"probe failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def show(title: str, run: dict) -> None:
    print(f"{title}: {run['cpu']:.2f} CPU-s, {run['wall']:.2f} s wall")
    for step, (cpu_s, wall_s) in run["steps"].items():
        print(f"  {step[:70]:70s} {cpu_s:6.2f} CPU-s {wall_s:7.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cold", action="store_true", help="also the first load into an empty cache, both ways")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--straightforward", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        probe(args.straightforward)
        return
    print(f"load average at the start: {os.getloadavg()[0]:.1f} (2-core machine shared with other jobs)")
    with tempfile.TemporaryDirectory() as cache:
        cold = measure(cache)  # the first load makes the copy (shown with --cold)
        warm = min((measure(cache) for _ in range(args.repeats)), key=lambda run: run["cpu"])
        show(f"warm load (best of {args.repeats} fresh processes)", warm)
        if not args.cold:
            print(f"seconds warm load: {warm['wall']:.2f}")
            return
        show("cold load, ours (the header parsed once)", cold)
    with tempfile.TemporaryDirectory() as cache:
        before = measure(cache, straightforward=True)
    show("cold load, straightforward (the header parsed four times)", before)
    print(f"ratio cold straightforward / ours: {before['cpu'] / cold['cpu']:.2f} (CPU), "
          f"{before['wall'] / cold['wall']:.2f} (wall)")


if __name__ == "__main__":
    main()
