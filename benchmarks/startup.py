"""Console startup on the embedded model: time from process start to the first painted screen, and
to a complete layer map, cold (a new session: load the model, compute the map) and cached
(reopening that session: the map comes from the store). Two yardsticks: an empty Textual app's
first paint on the same machine (the floor: Python and Textual alone; ours should be within 2x
of it) and the straightforward version, which imports torch and loads the model before the first
paint. Then the command line's answers that need no model loaded: `run --help`, a bad value
(`--sigma nan`) and a setting the model's config refuses (`--layers 99`), and `./start`'s check
that everything is installed (scripts/bootstrap.sh --check).

    python benchmarks/startup.py [--model smollm2-135m] [--paint-only] [--repeats 7]

`--paint-only` leaves out the layer maps (a minute of CPU on an idle machine, many on a shared one).
The first paints are medians of `--repeats` starts, the empty app's and ours in turns, with Python's
bytecode cached in a temporary folder for both (PYTHONPYCACHEPREFIX: as after any install's first
start; Textual's own was compiled when pip installed it), and once more for ours without it.

Each measurement is a fresh process (the console headless at 120x40). Last line:
`seconds first_paint: X`.
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

ROOT = Path(__file__).resolve().parent.parent


def probe(mode: str, session: str, model: str, started: float) -> None:
    """Runs inside the measured process; prints one JSON line of times (seconds since `started`)."""
    if mode == "empty":
        empty_app(started)
        return
    if mode == "eager":  # the straightforward version: the model first, then the UI
        from engine.models.loading import load_model

        load_model(model, device="cpu")
    from engine.models.options import ModelOptions
    from tui.app import AnatomyApp
    from tui.widgets.layer_map import LayerMap

    times: dict[str, float] = {}

    class Probe(AnatomyApp):
        def after_first_paint(self) -> None:  # ConsoleReady: painted, then every pane built
            assert self.first_paint is not None  # ConsolePainted came first, stamped at the paint
            ready = time.time()
            times["first_paint"] = ready - (time.perf_counter() - self.first_paint) - started
            times["ready"] = ready - started
            times["torch_at_paint"] = float("torch" in sys.modules)
            super().after_first_paint()
            if mode in ("eager", "lazy"):  # lazy: ours, to the first paint alone (--paint-only)
                self.exit()

        def poll(self) -> None:
            super().poll()
            if self.loaded is not None and "model_loaded" not in times:  # the worker's ModelLoaded arrived
                times["model_loaded"] = time.time() - started
                if mode == "cold" and "ablation" not in self.lab.cancels:
                    self.action_compute_map()
            screen = self._console()
            if mode in ("cold", "cached") and screen is not None and "ablation" in self.state.results:
                if screen.query_one(LayerMap).row_count == len(self.state.results["ablation"]["layers"]):
                    times["map_complete"] = time.time() - started
                    self.exit()

    options = ModelOptions(model, "cpu", "auto")
    app = Probe(session=session, options=options, load_model=mode != "eager")
    app.run(headless=True, size=(120, 40))
    print(json.dumps(times))


PREVIEWED_REFUSAL = """
import sys
from engine.core.errors import UserError
from engine.experiments.recovery.vocabulary import RecoverySettings
from engine.models.memory import preview_model
try:
    RecoverySettings(layers=(99,)).check_against(preview_model(sys.argv[1]).shape)
except UserError:
    sys.exit(2)
"""


def empty_app(started: float) -> None:
    """The floor: an empty Textual app, timed to its first paint as the console is."""
    from textual.app import App

    times: dict[str, float] = {}

    class Empty(App):
        def on_mount(self) -> None:
            self.call_after_refresh(self.painted)

        def painted(self) -> None:
            times["first_paint"] = time.time() - started
            self.exit()

    Empty().run(headless=True, size=(120, 40))
    print(json.dumps(times))


def command_seconds(command: list[str], home: str, repeats: int = 3) -> float:
    """The best of `repeats` wall-clock times of a command (each a fresh process)."""
    env = {**os.environ, "ANATOMY_TUI_HOME": home, "PYTHONPATH": str(ROOT)}
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        subprocess.run(command, env=env, cwd=ROOT, capture_output=True, timeout=600)
        best = min(best, time.perf_counter() - began)
    return best


def probe_env(home: str, bytecode: str | None) -> dict[str, str]:
    """The measured process's environment: with `bytecode` (a folder), Python reads and writes the
    compiled modules there (as any install does after its first start: pip compiles at install, a
    checkout writes __pycache__ on its first run); without, it compiles what has no .pyc yet (our
    modules, in a fresh checkout) at every start."""
    env = {**os.environ, "ANATOMY_TUI_HOME": home, "PYTHONPATH": str(ROOT)}
    env.pop("PYTHONPYCACHEPREFIX", None)
    if bytecode is None:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = bytecode
    return env


def measure(mode: str, session: str, model: str, home: str, bytecode: str | None = None) -> dict[str, float]:
    env = probe_env(home, bytecode)
    command = [sys.executable, __file__, "--probe", mode, "--session", session, "--model", model,
               "--started", repr(time.time())]
    out = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"{mode} probe failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def first_paints(model: str, home: str, bytecode: str, repeats: int) -> dict[str, float]:
    """Medians of `repeats` first paints of the empty app and of ours, taken in turns (a load that
    comes and goes touches both), after one start of each that compiles the bytecode; then ours
    again without a bytecode cache. Keys: empty, ours, ready (ours with every pane built),
    torch_at_paint (1.0 if any of ours had torch imported), uncompiled."""
    measure("empty", "empty", model, home, bytecode)
    measure("lazy", "paint-warm", model, home, bytecode)
    empty, ours, ready, torch, uncompiled = [], [], [], [], []
    for run in range(repeats):  # each of ours on a new session
        empty.append(measure("empty", "empty", model, home, bytecode)["first_paint"])
        times = measure("lazy", f"paint-{run}", model, home, bytecode)
        ours.append(times["first_paint"])
        ready.append(times["ready"])
        torch.append(times["torch_at_paint"])
        uncompiled.append(measure("lazy", f"paint-uncompiled-{run}", model, home)["first_paint"])
    return {"empty": statistics.median(empty), "ours": statistics.median(ours), "ready": statistics.median(ready),
            "torch_at_paint": max(torch), "uncompiled": statistics.median(uncompiled)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--paint-only", action="store_true", help="first paints and refusals, no layer maps")
    parser.add_argument("--repeats", type=int, default=7, help="first paints measured per app (the median is shown)")
    parser.add_argument("--probe", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--session", default="startup", help=argparse.SUPPRESS)
    parser.add_argument("--started", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        probe(args.probe, args.session, args.model, args.started)
        return
    cli = [sys.executable, "-m", "cli.main"]
    with tempfile.TemporaryDirectory() as home:
        bytecode = str(Path(home) / "pycache")
        paints = first_paints(args.model, home, bytecode, args.repeats)
        empty, ours = paints["empty"], paints["ours"]
        eager = measure("eager", "eager", args.model, home, bytecode)
        cold = None if args.paint_only else measure("cold", "startup", args.model, home, bytecode)
        cached = None if args.paint_only else measure("cached", "startup", args.model, home, bytecode)
        refusals = {
            "run --help": command_seconds([*cli, "run", "--help"], home),
            "run recovery --sigma nan": command_seconds([*cli, "run", "recovery", "--sigma", "nan"], home),
            "run recovery --layers 99": command_seconds([*cli, "run", "recovery", "--model", args.model,
                                                         "--layers", "99"], home),
        }
        # the straightforward refusal of --layers 99: the same check on the preview's shape (transformers' config
        # and tokenizer, the model on the meta device), where it was made before the config alone was read
        previewed = command_seconds([sys.executable, "-c", PREVIEWED_REFUSAL, args.model], home)
        check = ["bash", str(ROOT / "scripts" / "bootstrap.sh"), "--check"]
        installed = subprocess.run(check, capture_output=True).returncode == 0
        refusals[f"./start's install check ({'installed' if installed else 'not installed here'})"] = (
            command_seconds(check, home))
    print(f"model {args.model} on cpu, console headless at 120x40 (machine shared with other jobs); first paints: "
          f"the median of {args.repeats} fresh processes each, Python's bytecode cached for both apps")
    print(f"first paint, empty Textual app (the floor):  {empty:.2f} s")
    print(f"first paint, torch imported before it: {eager['first_paint']:.2f} s (straightforward version)")
    print(f"first paint, lazy (ours), new session:    {ours:.2f} s, torch imported then: "
          f"{bool(paints['torch_at_paint'])}; every pane built: {paints['ready']:.2f} s")
    print(f"first paint, ours with no bytecode cache (every module of ours compiled, a checkout's first start): "
          f"{paints['uncompiled']:.2f} s")
    if cold is not None and cached is not None:
        print(f"model loaded behind the console:           {cold['model_loaded']:.2f} s")
        print(f"complete layer map, cold (computed):       {cold['map_complete']:.2f} s")
        print(f"first paint, cached session:               {cached['first_paint']:.2f} s")
        print(f"complete layer map, cached (from store):   {cached['map_complete']:.2f} s")
    print(f"ratio first paint straightforward / ours: {eager['first_paint'] / ours:.1f}x")
    print(f"ratio first paint ours / empty app: {ours / empty:.2f}x (target <= 2)")
    print(f"ratio first paint ours with no bytecode cache / empty app: {paints['uncompiled'] / empty:.2f}x "
          "(target <= 2)")
    for what, seconds in refusals.items():
        print(f"{what + ':':52} {seconds:.2f} s (best of 3)")
    print(f"{'--layers 99 refused after the preview (straightforward):':52} {previewed:.2f} s (best of 3)")
    print(f"ratio refusal after the preview / from the config: {previewed / refusals['run recovery --layers 99']:.1f}x")
    print(f"seconds first_paint: {ours:.2f}")


if __name__ == "__main__":
    main()
