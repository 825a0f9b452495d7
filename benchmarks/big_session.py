"""A session with a large event log, opened by the console: time to the first complete paint (every
panel drawn from the whole log) and memory, the straightforward way (fold every line of the log)
against ours (the event index, `tui/event_index.py`: the lines the panels still depend on, then the
log's tail).

    python benchmarks/big_session.py [--megabytes 50]

The log is what a long session writes: an ablation map (proxies, a row per layer, its result), a
recovery sweep (30 layers x 3 repeats, a point and a progress line per step, a summary per layer),
a growth run (a step line per step, evaluations, phases) and job messages, repeated until the log is
the size asked for. Each measurement is a fresh process running the console headless (no model).
Last line: `ratio big_session_first_paint: X`.
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
from engine.core.events import Event, Finished, Message, Progress, Result, Started  # noqa: E402
from engine.experiments.ablation.vocabulary import AblationMap, AblationProxies, AblationRow, LayerAblated  # noqa: E402
from engine.experiments.growth.vocabulary import GrowthEval, GrowthPhase, GrowthPlan, GrowthStep  # noqa: E402
from engine.experiments.recovery.vocabulary import RecoveryLayer, RecoveryPoint, RecoveryRow, RecoveryStart  # noqa: E402
from sessions.store import SessionStore  # noqa: E402

LAYERS = 30
REPEATS = 3
STEPS = 2000
GROWTH_STEPS = 4000


def _line(event: Event) -> bytes:
    return (json.dumps(event.to_json()) + "\n").encode()


def _ablation(job: str, t: float) -> list[Event]:
    rows = [AblationRow(layer=i, ppl=20.0 + i, degradation_pct=5.0 * i, layer_class="minor", anti=False,
                        anti_within_noise=False, ci_low=None, ci_high=None, block_influence=0.01 * i,
                        angular_distance=0.02 * i) for i in range(LAYERS)]  # fmt: skip
    doc = json_safe(AblationMap(model="synthetic", method="mean", baseline_ppl=20.0, eval_tokens=882, eval_texts=48,
                                seconds=40.0, settings={}, layers=rows, spearman={}))  # fmt: skip
    events: list[Event] = [Started("ablation", {}, job=job, t=t),
                           AblationProxies([0.01 * i for i in range(LAYERS)], [0.02 * i for i in range(LAYERS)], 20.0,
                                           job=job, t=t)]  # fmt: skip
    for row in rows:
        events += [LayerAblated(row.layer, LAYERS, row.ppl, 20.0, row.degradation_pct, "minor", job=job, t=t),
                   Progress(row.layer + 1, LAYERS, f"layer {row.layer}", job=job, t=t)]  # fmt: skip
    return [*events, Result("ablation", doc, job=job, t=t), Finished("done", job=job, t=t)]


def _summary(layer: int) -> RecoveryRow:
    return RecoveryRow(
        layer=layer, status="done", ppl_after_noise=80.0, ratio_after_noise=4.0, steps_to={"2.0": 10}, best_ppl=21.0,
        best_step=STEPS, final_ppl=21.0, final_ratio=1.05, improved_over_baseline=False, curve=[[0.0, 80.0]],
        diverged_at=None, steps_run=STEPS, seconds=100.0, seconds_per_step=0.05, train_loss=[[1, 3.0]],
        difficulty=10.0, mean_final_ratio=1.05, steps_to_mean={"2.0": 10.0}, steps_to_sd={"2.0": None},
        steps_to_reached={"2.0": 1}, repeats=[],
    )  # fmt: skip


def write_big_session(store: SessionStore, name: str, megabytes: float) -> int:
    """A session `name` whose event log is about `megabytes` long; returns its size in bytes."""
    session = store.create(name, model="synthetic")
    target, t, written, round_ = int(megabytes * 1e6), 1.7e9, 0, 0
    with open(session.events_path, "wb") as log:

        def put(events: list[Event]) -> None:
            nonlocal written
            data = b"".join(_line(event) for event in events)
            log.write(data)
            written += len(data)

        put(_ablation(f"ablation-{round_}", t))
        while written < target:
            round_ += 1
            job = f"recovery-{round_}"
            put([Started("recovery", {"sigma": 0.5, "steps": STEPS, "lr": 1e-4}, job=job, t=t)])
            for layer in range(LAYERS):
                for repeat in range(REPEATS):
                    put([RecoveryStart(layer, repeat, 80.0, 20.0, STEPS, job=job, t=t)])
                    put([event for step in range(0, STEPS, 1) for event in (
                        RecoveryPoint(layer, repeat, step, 3.0 - step / STEPS, 80.0 - 59 * step / STEPS,
                                      4.0 - 3 * step / STEPS, job=job, t=t + step),
                        Progress(step, STEPS, f"layer {layer} #{repeat}", job=job, t=t + step),
                    )])  # fmt: skip
                    if written >= target:
                        break
                put([RecoveryLayer(layer, _summary(layer), job=job, t=t),
                     Message(f"layer {layer} recovered", job=job, t=t)])  # fmt: skip
                if written >= target:
                    break
            put([Finished("done", job=job, t=t)])
            put(_growth(f"growth-{round_}", t))
    return written


def _growth(job: str, t: float) -> list[Event]:
    arms = {"growth_100": {"steps": GROWTH_STEPS, "phases": []}, "uniform_100": {"steps": GROWTH_STEPS, "phases": []}}
    events: list[Event] = [Started("growth", {}, job=job, t=t),
                           GrowthPlan(arms, [0], {"growth_100": 1, "uniform_100": 1}, [], 1024, job=job, t=t)]
    for arm in arms:
        events.append(GrowthPhase(arm, 0, "growth", 0, 0, GROWTH_STEPS, [0, 1], [], job=job, t=t))
        for step in range(1, GROWTH_STEPS + 1):
            events.append(GrowthStep(arm, 0, "growth", step, GROWTH_STEPS, 4.0 - step / GROWTH_STEPS, 1e4, 1e-3, 2,
                                     job=job, t=t + step))  # fmt: skip
            if step % 100 == 0:
                events.append(GrowthEval(arm, 0, "growth", step, 4.1 - step / GROWTH_STEPS, job=job, t=t + step))
    return [*events, Finished("done", job=job, t=t)]


def probe(mode: str, session: str, started: float) -> None:
    """Runs inside the measured process: the console headless, timed until the whole log is drawn."""
    import resource

    import tui.lab
    from tui import event_index
    from tui.app import AnatomyApp

    times: dict[str, float] = {}

    class Probe(AnatomyApp):
        def after_first_paint(self) -> None:
            times["screen"] = time.time() - started
            super().after_first_paint()

        def poll(self) -> None:
            super().poll()
            if self.lab.offset >= size and "complete" not in times:
                usage = resource.getrusage(resource.RUSAGE_SELF)
                times["complete"] = time.time() - started
                times["cpu"] = usage.ru_utime + usage.ru_stime
                times["polls"] = self.lab.polls
                times["rss_mb"] = usage.ru_maxrss / 1024
                self.lab.closing()  # as quitting does: the index brought up to date
                self.exit()

    size = (SessionStore().open(session).events_path).stat().st_size
    app = Probe(session=session, load_model=False)
    if mode == "full":  # the straightforward way: every line of the log folded in the first poll, no index
        tui.lab.READ_LIMIT, tui.lab.FOLD_SECONDS = None, float("inf")
        event_index.load = event_index.write = lambda *args: None  # type: ignore[assignment]  # no index, on purpose
        app.lab.keeper.fold = lambda span, event: app.lab.state.apply(event)  # type: ignore[method-assign]  # fold all
    app.run(headless=True, size=(120, 40))
    print(json.dumps(times))


def measure(mode: str, session: str, home: str) -> dict[str, float]:
    env = {**os.environ, "ANATOMY_TUI_HOME": home, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, __file__, "--probe", mode, "--session", session, "--started", repr(time.time())]
    out = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"{mode} probe failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--megabytes", type=float, default=50.0)
    parser.add_argument("--probe", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--session", default="big", help=argparse.SUPPRESS)
    parser.add_argument("--started", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--home", default=None, help="keep the built session in this folder")
    args = parser.parse_args()
    if args.probe:
        probe(args.probe, args.session, args.started)
        return
    with tempfile.TemporaryDirectory() as scratch:
        home = args.home or scratch
        size = write_big_session(SessionStore(Path(home)), "big", args.megabytes)
        full = measure("full", "big", home)  # the straightforward way
        first = measure("index", "big", home)  # no index yet: the log is folded, the index written
        again = measure("index", "big", home)  # reopened: the index, then the tail
        index_bytes = (Path(home) / "big" / "events.index.json").stat().st_size
    print(f"event log {size / 1e6:.1f} MB, index {index_bytes / 1e3:.1f} kB; console headless at 120x40, no model")
    for label, t in (("straightforward (every line folded)", full), ("ours, first open (no index yet)", first),
                     ("ours, reopened (index + tail)", again)):  # fmt: skip
        print(f"{label:40s} screen {t['screen']:.2f} s, complete {t['complete']:.2f} s "
              f"({t['polls']:.0f} polls, {t['cpu']:.2f} s of CPU), peak RSS {t['rss_mb']:.0f} MB")
    print(f"ratio big_session_first_paint: {full['complete'] / again['complete']:.1f} (CPU to the complete paint: "
          f"{full['cpu'] / again['cpu']:.1f})")


if __name__ == "__main__":
    main()
