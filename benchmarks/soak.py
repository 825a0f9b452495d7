"""Soak: a job appends events as fast as it can (a message, then a progress line, each numbered)
while the console follows the session headless, for a few minutes. Prints the events written per
second, the console's CPU (its CPU seconds over the wall seconds), its memory at the start and the
end of the run (RSS sampled every 5 s), and whether every number reached the console's state once and
in order. Run twice: the straightforward console (every new line read in one poll, no index) and
ours (READ_LIMIT bytes a poll, the event index written as it goes).

    python benchmarks/soak.py [--seconds 120] [--ours-only] [--trace]

`--trace`: the console runs under tracemalloc and prints, at its end, the 12 places whose memory
grew most from 10 s on (how the soak's growth was found).

Last line: `ratio soak_console_cpu straightforward / ours: X`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WRITER = """
import sys, time
from pathlib import Path
from engine.core.events import Finished, Message, Progress, Started
from sessions.store import SessionStore
session = SessionStore(Path(sys.argv[1])).open("soak")
session.append_event(Started("soak", {}, job="soak"))
n, end = 0, time.time() + float(sys.argv[2])
while time.time() < end:
    session.append_event(Progress(n, 0, "soak", job="soak") if n % 2 else Message(f"seq {n}", job="soak"))
    n += 1
session.append_event(Finished("done", job="soak"))
print(n)
"""


class Sequence:
    """The numbers the console folded, checked as they come (each must be the next: 0, 1, 2, ...) in
    constant memory. The harness used to keep them all in a list, some 40 bytes a number (a pointer
    and an int object): that list was the soak's whole "console memory growth" (issue 29)."""

    def __init__(self) -> None:
        self.count, self.in_order = 0, True

    def add(self, number: int) -> None:
        self.in_order = self.in_order and number == self.count
        self.count += 1


def console(mode: str, trace: bool = False) -> None:
    """Runs inside the measured process: the console on session 'soak' until the job's end is read."""
    import tracemalloc

    import psutil

    import tui.lab
    from engine.core.events import Finished, Message, Progress
    from tui import event_index
    from tui.app import AnatomyApp

    me = psutil.Process()
    seen = Sequence()  # a count and a flag, not a list of every number: the harness must not grow either
    samples: list[tuple[float, float]] = []
    started = time.time()

    baseline: list[tracemalloc.Snapshot] = []

    def trace_from_now() -> None:  # from 10 s on only: what the console keeps as it follows the log
        tracemalloc.start(8)
        baseline.append(tracemalloc.take_snapshot())

    class Follower(AnatomyApp):
        def after_first_paint(self) -> None:
            super().after_first_paint()
            self.set_interval(5.0, lambda: samples.append((time.time() - started, me.memory_info().rss / 2**20)))
            if trace:
                self.set_timer(10.0, trace_from_now)

    app = Follower(session="soak", load_model=False)
    fold = app.lab.keeper.fold  # counted from the first line on
    if mode == "full":  # the straightforward console: every new line in one poll, no index
        tui.lab.READ_LIMIT, tui.lab.FOLD_SECONDS = None, float("inf")
        event_index.write = lambda *args: False  # the console without its index, on purpose
        fold = lambda span, event: app.lab.state.apply(event)  # noqa: E731

    def counting(span, event) -> None:
        if isinstance(event, (Message, Progress)) and event.job == "soak":
            seen.add(int(event.text.split()[1]) if isinstance(event, Message) else event.done)
        if isinstance(event, Finished) and event.job == "soak":
            app.call_later(app.exit)
        fold(span, event)

    app.lab.keeper.fold = counting  # type: ignore[method-assign]  # counts each event, then folds it as the lab does
    app.run(headless=True, size=(120, 40))
    if trace and baseline:
        for stat in tracemalloc.take_snapshot().compare_to(baseline[0], "traceback")[:12]:
            print(f"{stat.size_diff / 2**20:+.1f} MB in {stat.count_diff:+,} blocks", file=sys.stderr)
            for line in stat.traceback.format()[-8:]:
                print("   ", line, file=sys.stderr)
    cpu = me.cpu_times()
    print(json.dumps({"seen": seen.count, "in_order": seen.in_order, "wall": time.time() - started,
                      "cpu": cpu.user + cpu.system, "samples": samples}))


def run(mode: str, seconds: float, trace: bool = False) -> dict:
    from sessions.store import SessionStore

    with tempfile.TemporaryDirectory() as home:
        SessionStore(Path(home)).create("soak", model="synthetic")
        env = {**os.environ, "ANATOMY_TUI_HOME": home, "PYTHONPATH": str(ROOT)}
        follower = subprocess.Popen([sys.executable, __file__, "--console", mode, *(["--trace"] if trace else [])],
                                    env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)  # fmt: skip
        time.sleep(3.0)  # the console is up
        writer = subprocess.run([sys.executable, "-c", WRITER, home, str(seconds)], env=env, cwd=ROOT,
                                capture_output=True, text=True, check=True)  # fmt: skip
        out, _ = follower.communicate(timeout=600)
        size = (Path(home) / "soak" / "events.jsonl").stat().st_size
    result = json.loads(out.strip().splitlines()[-1])
    result.update(written=int(writer.stdout), seconds=seconds, megabytes=size / 1e6)
    return result


def report(label: str, r: dict) -> None:
    rss = [mb for t, mb in r["samples"] if t > 10] or [mb for _, mb in r["samples"]]
    print(f"{label}: {r['written'] / r['seconds']:,.0f} events/s written ({r['megabytes']:.0f} MB), "
          f"console CPU {r['cpu'] / r['wall']:.0%} of one core, RSS {rss[0]:.0f} -> {rss[-1]:.0f} MB "
          f"(max {max(rss):.0f}), numbers seen {r['seen']:,} of {r['written']:,}, in order: {r['in_order']}")
    every = max(1, len(r["samples"]) // 10)  # about ten points of the RSS over the run
    print("  RSS MB at s: " + ", ".join(f"{t:.0f}: {mb:.0f}" for t, mb in r["samples"][::every]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="how long the job writes, each run")
    parser.add_argument("--ours-only", action="store_true", help="only our console (no straightforward run)")
    parser.add_argument("--trace", action="store_true", help="where the console's memory grows (tracemalloc)")
    parser.add_argument("--console", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.console:
        console(args.console, args.trace)
        return
    full = None if args.ours_only else run("full", args.seconds, args.trace)
    ours = run("ours", args.seconds, args.trace)
    print(f"a job writing events as fast as it can for {args.seconds:.0f} s, the console following it headless")
    if full is None:
        report("ours", ours)
        return
    report("straightforward", full)
    report("ours", ours)
    share = {label: r["cpu"] / r["wall"] for label, r in (("full", full), ("ours", ours))}
    print(f"ratio soak_console_cpu straightforward / ours: {share['full'] / share['ours']:.2f}")


if __name__ == "__main__":
    main()
