"""A store of a thousand sessions: how long `anatomy-tui sessions list` takes, the console's session
picker takes to show them, and the console takes to open one of them, each in a fresh process.
Each session holds what a worked session holds: a manifest, an ablation map and a recovery result
(curves included), two job files and an event log.

    python benchmarks/many_sessions.py [--sessions 1000]

The straightforward version of the listing reads every event log too (the console's fold of each);
ours reads the manifest, the job files and the results (which `sessions list` shows), never a log.
Last line: `ratio many_sessions_list straightforward / ours: X`.
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

from engine.core.codec import json_safe  # noqa: E402
from engine.core.events import Finished, Progress, Started  # noqa: E402
from engine.experiments.ablation.vocabulary import AblationMap, AblationRow  # noqa: E402
from engine.experiments.recovery.vocabulary import RecoveryPoint  # noqa: E402
from sessions.store import SessionStore  # noqa: E402

LAYERS = 30


def build(home: Path, count: int) -> int:
    """`count` sessions under `home`; returns the bytes written."""
    rows = [AblationRow(layer=i, ppl=20.0 + i, degradation_pct=5.0 * i, layer_class="minor", anti=False,
                        anti_within_noise=False, ci_low=1.0, ci_high=2.0, block_influence=0.01 * i,
                        angular_distance=0.02 * i) for i in range(LAYERS)]  # fmt: skip
    ablation = json_safe(AblationMap(model="synthetic", method="mean", baseline_ppl=20.0, eval_tokens=882,
                                     eval_texts=48, seconds=40.0, settings={}, layers=rows, spearman={}))  # fmt: skip
    curves = [[[float(step), 80.0 - step / 10] for step in range(400)] for _ in range(5)]
    recovery = {"model": "synthetic", "baseline_ppl": 20.0, "settings": {},
                "layers": [{"layer": i, "curve": curve} for i, curve in enumerate(curves)]}  # fmt: skip
    log = b"".join((json.dumps(event.to_json()) + "\n").encode() for event in [
        Started("recovery", {}, job="recovery-1"),
        *(e for step in range(100) for e in (RecoveryPoint(1, 0, step, 3.0, 50.0, 2.5, job="recovery-1"),
                                             Progress(step, 100, "layer 1", job="recovery-1"))),
        Finished("done", job="recovery-1"),
    ])  # fmt: skip
    store, written = SessionStore(home), 0
    for n in range(count):
        session = store.create(f"session-{n:04d}", model="synthetic")
        session.save_result("ablation", ablation)
        session.save_result("recovery", recovery)
        for job in ("ablation-1", "recovery-1"):
            session.write_job(job, {"status": "done", "experiment": job.split("-")[0], "pid": 1, "started": 1.0})
        session.events_path.write_bytes(log)
        written += sum(path.stat().st_size for path in session.path.rglob("*") if path.is_file())
    return written


def probe(what: str, started: float) -> None:
    """Runs inside the measured process; prints the seconds from `started` (the parent's clock just
    before it started this process) to the moment measured, and ends the process there."""
    if what == "list":
        from cli.commands.sessions import main as sessions_main

        sessions_main(argparse.Namespace(sessions_command="list"))
    elif what == "list-straightforward":  # every session's log folded too
        from tui.state import SessionState

        for info in SessionStore().list():
            if info.openable:
                state = SessionState()
                for event in SessionStore().open(info.name).events():
                    state.apply(event)
    elif what in ("picker", "open"):
        from textual.widgets import DataTable

        from tui.app import AnatomyApp
        from tui.screens.picker import SessionPicker

        class Probe(AnatomyApp):
            def on_mount(self) -> None:
                super().on_mount()
                self.set_interval(0.01, self.check)

            def check(self) -> None:
                screen = self.screen
                if what == "picker" and isinstance(screen, SessionPicker) and screen.query_one(DataTable).row_count:
                    done()
                elif what == "open" and self.first_paint is not None:
                    done()

        Probe(session="session-0500" if what == "open" else None, load_model=False).run(headless=True, size=(120, 40))
    done()


def done() -> None:
    print(json.dumps({"seconds": time.time() - STARTED}), file=sys.stderr, flush=True)
    os._exit(0)  # now: not after the console's background threads


STARTED = 0.0


def measure(what: str, home: str) -> float:
    env = {**os.environ, "ANATOMY_TUI_HOME": home, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, __file__, "--probe", what, "--started", repr(time.time())], env=env,
                         cwd=ROOT, capture_output=True, text=True, timeout=1800)  # fmt: skip
    if out.returncode != 0:
        raise SystemExit(f"{what} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stderr.strip().splitlines()[-1])["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--probe", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--started", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        global STARTED
        STARTED = args.started
        probe(args.probe, args.started)
        return
    with tempfile.TemporaryDirectory() as home:
        size = build(Path(home), args.sessions)
        times = {what: measure(what, home) for what in ("list-straightforward", "list", "picker", "open")}
    print(f"{args.sessions} sessions, {size / 1e6:.0f} MB in all; each a fresh process, timed from its start")
    print(f"sessions list, straightforward (every log folded too): {times['list-straightforward']:.2f} s")
    print(f"anatomy-tui sessions list (ours):                      {times['list']:.2f} s")
    print(f"console, the picker showing every session:             {times['picker']:.2f} s")
    print(f"console, opening one of them to its first paint:       {times['open']:.2f} s")
    print(f"ratio many_sessions_list straightforward / ours: {times['list-straightforward'] / times['list']:.1f}")


if __name__ == "__main__":
    main()
