"""GPU check (issue 18): runs the experiments as users run them and decides, one line per figure.

    benchmarks/gpu_check.sh [--device cuda:0] [--quick] [--model NAME_OR_FOLDER]

Every run is `anatomy-tui run ...` in its own process (through benchmarks/gpu_probe.py, which adds
the peak memory, the host-sync count and the loss scaler to what the command does), with its
memory plan and model load, into sessions in a temporary folder. Each figure prints as
`PASS|FAIL <figure>: <value> (<bound>)`; figures a CPU cannot give as `SKIP <figure>: needs a GPU`;
the card and the settings as `INFO ...`; then one `SUMMARY` line. Exit code 1 when a figure failed.

Bounds, and why:
- peak/plan: torch.cuda.max_memory_allocated of the run (the load included) over the plan's total,
  within 0.7-1.1: the plan counts what our code keeps alive, so a run far under it wastes the
  evaluation batch it could have had, and one over it can run out of memory where the plan said it fits.
- the map in each dtype against the CPU float32 map: baseline perplexity within 1e-5 relative in
  float32 (run with --no-tf32: TF32 rounds matmul inputs to 10 bits) and 1e-2 in half precision,
  Spearman of D % >= 0.99, and no inf/NaN layer.
- host syncs (torch.cuda.set_sync_debug_mode("warn"), counted from the experiment's start): per
  ablated layer at most 2 + 3 per evaluation batch (Evaluator._gather copies a layer's scores to the
  host once; transformers' mask code reads the padding mask, up to 3 times a forward; one spare);
  per recovery step at most 6 (the caller reads the loss, GradScaler checks for overflow in float16,
  the step's rows are copied to the GPU, up to 3 from transformers' mask code); per growth step at
  most 5 (the batch copied to the GPU, the overflow check, the mask code, and the validation and
  timing reads spread over the steps between two validations). The median unit is judged (a
  layer's first recovery step also noises and evaluates it); the largest is shown.
- float16 recovery's GradScaler: final loss scale finite, skipped steps under 10 % of the steps.
- prune with healing, float16 and float32: healed perplexity finite and <= 1.05 x the unhealed one.
- determinism (--deterministic, the default, passed explicitly): the map and the float16 recovery
  run twice give the same bits, else the largest difference is printed.
- out of memory in ablation, recovery, growth and prune, provoked on the GPU (the probe caps the
  process at what it holds when the experiment starts): exit code 2 and exactly one stderr line
  naming out of memory, no traceback.
- answers before torch (issue 31): `run --help` (exit 0) and `run recovery --layers 99` (exit 2, the
  model's depth read from its config or GGUF header) import no torch and no transformers
  (`python -X importtime`); the seconds are shown (on a GPU box torch's CUDA import is the slow part).
- two GPUs or more: --device-map balanced against one GPU (ablation, dynamics, weights, prune) and
  --shards 2 against the serial map within 1e-5 relative, and the console's map and recovery jobs
  (the command the console builds, with --shards) against serial runs.
- the streamed map (issue 42, benchmarks/streamed_gpu.py): a random Llama twice a 3 GiB budget
  written to disk, mapped streamed under that budget and in memory: each tensor read once, equal
  maps (1e-3 relative in bfloat16), the device peak within the budget; the disk's GB/s, the GPU's
  share of the wall time and the wall ratio as INFO lines.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PROBE = ROOT / "benchmarks" / "gpu_probe.py"
QUIET = {"TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error"}

DTYPES = ("float32", "float16", "bfloat16")
BASELINE_BOUND = {"float32": 1e-5, "float16": 1e-2, "bfloat16": 1e-2}
SPEARMAN_BOUND = 0.99
PEAK_LOW, PEAK_HIGH = 0.7, 1.1
SYNCS_PER_STEP = {"recovery": 6, "growth": 5}
SKIPPED_SHARE = 0.10
HEALED_RATIO = 1.05
SPREAD_BOUND = 1e-5  # --device-map and --shards against one device
TIMING = {"seconds", "seconds_per_step", "tokens_per_s"}  # result fields that are clocks, not answers


@dataclass
class Run:
    """One finished `anatomy-tui run` process: exit code, stderr, its result (--json), its memory
    plan (the session's job file) and the probe's report."""

    name: str
    rc: int
    stderr: str
    result: dict | None
    plan: dict | None
    probe: dict
    seconds: float

    @property
    def error(self) -> str | None:
        if self.rc == 0 and self.result is not None:
            return None
        lines = [line.strip() for line in self.stderr.replace("\r", "\n").splitlines() if line.strip()]
        said = next((line for line in reversed(lines) if "error" in line.lower()), lines[-1] if lines else "")
        return f"{self.name} exited {self.rc}: {said[:160]}"


@dataclass
class Check:
    args: argparse.Namespace
    work: Path
    counts: Counter = field(default_factory=Counter)
    clock: dict[str, float] = field(default_factory=dict)  # seconds of each run, for the closing INFO line

    @property
    def gpu(self) -> bool:
        return self.args.device.startswith("cuda")

    # --- lines ---------------------------------------------------------------------------------
    def verdict(self, figure: str, passed: bool, value: str, bound: str) -> None:
        self._line("PASS" if passed else "FAIL", f"{figure}: {value} ({bound})")

    def skip(self, figure: str, why: str = "needs a GPU") -> None:
        self._line("SKIP", f"{figure}: {why}")

    def info(self, text: str) -> None:
        print(f"INFO {text}", flush=True)

    def _line(self, status: str, text: str) -> None:
        self.counts[status] += 1
        print(f"{status} {text}", flush=True)

    def judge(self, figure: str, bound: str, runs: tuple[Run | None, ...], verdict: Callable[[], tuple[bool, str]]
              ) -> None:
        """One figure's line: `verdict()` gives (passed, value); a failed run it needs, or an error in
        the check itself, is its FAIL line."""
        failed = next((run.error for run in runs if run is not None and run.error), None)
        if failed:
            self.verdict(figure, False, failed, bound)
            return
        try:
            passed, value = verdict()
        except Exception as exc:  # the check's own mistake is a FAIL line, never a traceback
            passed, value = False, f"check error {type(exc).__name__}: {str(exc)[:160]}"
        self.verdict(figure, passed, value, bound)

    # --- runs ----------------------------------------------------------------------------------
    def run(self, name: str, experiment: str, flags: list[str], env: dict[str, str] | None = None,
            argv: list[str] | None = None) -> Run:
        """`anatomy-tui run EXPERIMENT FLAGS --session NAME --json FILE` through the probe (or `argv`
        exactly, the console's command, read back from its session)."""
        home, report = self.work / "sessions", self.work / f"{name}.probe.json"
        out = self.work / f"{name}.json"
        command = argv or [sys.executable, str(PROBE), "run", experiment, *flags, "--session", name, "--json", str(out)]
        device = self.args.device if self.gpu else "cpu"
        path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])  # this checkout, shard workers too
        environ = {**os.environ, **QUIET, "ANATOMY_TUI_HOME": str(home), "GPU_CHECK_REPORT": str(report),
                   "GPU_CHECK_DEVICE": device, "PYTHONPATH": path, **(env or {})}
        started = time.perf_counter()
        process = subprocess.Popen(command, cwd=ROOT, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   text=True, start_new_session=True)
        try:
            _, stderr = process.communicate(timeout=self.args.timeout)
            rc = process.returncode
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            _, stderr = process.communicate()
            rc, stderr = 124, f"{stderr}\nerror: timed out after {self.args.timeout} s"
        self.clock[name] = time.perf_counter() - started
        result_file = out if argv is None else home / name / "results" / f"{experiment}.json"
        return Run(name, rc, stderr, _read(result_file), _job_plan(home / name), _read(report) or {},
                   self.clock[name])


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _job_plan(session: Path) -> dict | None:
    """The memory plan the run recorded in its job file (`spec.memory_plan`)."""
    for job in sorted((session / "jobs").glob("*.json")):
        plan = (_read(job) or {}).get("spec", {}).get("memory_plan")
        if plan:
            return plan
    return None


# --- comparing results --------------------------------------------------------------------------
def numbers(doc: Any, path: str = "") -> dict[str, Any]:
    """Every number of a result document by its path (clocks left out); strings too, compared as-is."""
    if isinstance(doc, dict):
        return {k: v for key, value in doc.items() if key not in TIMING
                for k, v in numbers(value, f"{path}.{key}" if path else key).items()}
    if isinstance(doc, list):
        return {k: v for i, value in enumerate(doc) for k, v in numbers(value, f"{path}[{i}]").items()}
    return {path: doc}


def largest_difference(a: dict, b: dict) -> tuple[float, str]:
    """The largest relative difference between two result documents and where; inf when their
    shapes or texts differ."""
    left, right = numbers(a), numbers(b)
    if left.keys() != right.keys():
        where = sorted(left.keys() ^ right.keys())[0]
        return math.inf, f"{where} only in one"
    worst, where = 0.0, ""
    for key, x in left.items():
        y = right[key]
        if x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)):
            continue
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (x, y)):
            return math.inf, key
        gap = abs(x - y) / max(abs(x), abs(y)) if math.isfinite(x) and math.isfinite(y) else math.inf
        if gap > worst:
            worst, where = gap, key
    return worst, where


def finite(value: Any) -> bool:
    """A finite number (result documents save inf and NaN as None)."""
    return isinstance(value, int | float) and math.isfinite(value)


def unit_syncs(run: Run, event: str) -> list[float]:
    """Host syncs per unit: between consecutive `event`s (Progress: one layer or one step), or per
    step between consecutive growth validations (GrowthEval marks its step)."""
    marks = [(mark, syncs) for kind, mark, syncs in run.probe.get("events", []) if kind == event]
    if event == "GrowthEval":
        return [(b[1] - a[1]) / (b[0] - a[0]) for a, b in zip(marks, marks[1:], strict=False) if b[0] > a[0]]
    return [b[1] - a[1] for a, b in zip(marks, marks[1:], strict=False)]


# --- the settings -------------------------------------------------------------------------------
def layer_count(model: str) -> int:
    """Layers of the model, from its config (the embedded GGUF's dequantized folder, made once)."""
    from transformers import AutoConfig

    from engine.models.gguf_cache import dequantized_folder
    from engine.models.sources import resolve

    source = resolve(model)
    location = dequantized_folder(Path(source.location)) if source.kind == "gguf" else source.location
    config = AutoConfig.from_pretrained(location)
    return int(getattr(config, "num_hidden_layers", None) or config.n_layer)


@dataclass(frozen=True)
class Settings:
    """The flags of each run: --quick keeps the CPU dry run to minutes."""

    map: list[str]
    recovery: list[str]
    growth: list[str]
    prune: list[str]
    dynamics: list[str]
    weights: list[str]

    @classmethod
    def choose(cls, quick: bool, n_layers: int) -> Settings:
        if quick:
            short = ["--eval-set", "paper", "--max-length", "64"]
            layers = sorted({max(n_layers - k, 0) for k in (3, 2, 1)})  # late layers: cheap from the prefix cache
            blocks = ["--batch-size", "1", "--block-size", "32", "--train-blocks", "4"]
            return cls(
                map=[*short, "--layers", ",".join(map(str, layers))],
                recovery=[*short, "--layers", str(n_layers - 1), "--steps", "4", "--eval-every", "2", *blocks],
                growth=["--preset", "tiny", "--arms", "uniform_100", "--steps", "12", "--eval-every", "4",
                        "--eval-batches", "1", "--batch-size", "4", "--seq-len", "32", "--hidden-size", "64",
                        "--heads", "4", "--base-ffn", "96", "--checkpoint-every", "0", "--gen-tokens", "0"],
                prune=[*short, "--method", "bi", "--remove", "1", "--bootstrap", "0", "--heal-steps", "3", *blocks],
                dynamics=["--max-tokens", "256", "--max-length", "64", "--clusters", "2"],
                weights=[*short, "--null-draws", "1", "--paradox-counts", "1"],
            )
        return cls(
            map=[],
            recovery=["--layers", str(n_layers // 2), "--steps", "20", "--eval-every", "5"],
            growth=["--preset", "tiny", "--arms", "uniform_100", "--steps", "40", "--eval-every", "10",
                    "--eval-batches", "2", "--checkpoint-every", "0", "--gen-tokens", "0"],
            prune=["--method", "bi", "--remove", "2", "--bootstrap", "0", "--heal-steps", "5"],
            dynamics=["--max-tokens", "2048"],
            weights=["--eval-set", "paper", "--null-draws", "1", "--paradox-counts", "1,3"],
        )


# --- the figures --------------------------------------------------------------------------------
def device_info(check: Check) -> None:
    import torch

    from engine.models.memory import free_memory

    device = check.args.device
    if not check.gpu:
        check.info(f"device: cpu ({torch.get_num_threads()} threads), torch {torch.__version__}")
        check.info("compute capability: none (CPU)")
        check.info("native bf16: not applicable (CPU)")
        check.info(f"free memory: {free_memory('cpu') / 1e9:.1f} GB of RAM available")
        return
    index = torch.device(device).index or 0
    props = torch.cuda.get_device_properties(index)
    check.info(f"device: {device} ({props.name}), torch {torch.__version__}, CUDA {torch.version.cuda}, "
               f"{torch.cuda.device_count()} GPU(s) visible")
    check.info(f"compute capability: {props.major}.{props.minor}")
    check.info(f"native bf16: {'yes' if torch.cuda.is_bf16_supported(including_emulation=False) else 'no'} "
               "(torch.cuda.is_bf16_supported(including_emulation=False))")
    free, total = torch.cuda.mem_get_info(index)
    check.info(f"free memory: {free / 2**30:.1f} GiB of {total / 2**30:.1f} GiB")


def model_flags(check: Check, dtype: str, device: str | None = None) -> list[str]:
    """The model flags of a run. float32 runs without TF32 (on by default on Ampere and later: it
    rounds matmul inputs to 10 bits, which the 1e-5 bound of float32 is not for)."""
    exact = ["--no-tf32"] if dtype == "float32" else []
    return ["--model", check.args.model, "--device", device or check.args.device, "--dtype", dtype,
            "--deterministic", *exact]


def gpu_only(check: Check, figure: str, run: Run | None) -> bool:
    """True when the figure can be judged here; on the CPU its SKIP line, or the FAIL line of the
    run it needed (a dry run still shows that the command works)."""
    if check.gpu:
        return True
    if run is not None and run.error:
        check.verdict(figure, False, run.error, "runs")
    else:
        check.skip(figure)
    return False


def peak_figure(check: Check, figure: str, run: Run) -> None:
    if not gpu_only(check, figure, run):
        return

    def verdict() -> tuple[bool, str]:
        peak, plan = run.probe["peak"], run.plan["total"]
        ratio = peak / plan
        return PEAK_LOW <= ratio <= PEAK_HIGH, f"{ratio:.2f} (peak {peak / 1e9:.3f} GB, plan {plan / 1e9:.3f} GB)"

    check.judge(figure, f"{PEAK_LOW}-{PEAK_HIGH}", (run,), verdict)


def map_figures(check: Check, dtype: str, run: Run, reference: Run) -> None:
    from engine.evaluation.statistics import spearman

    def baseline() -> tuple[bool, str]:
        ours, cpu = run.result["baseline_ppl"], reference.result["baseline_ppl"]
        if not (finite(ours) and finite(cpu)):
            return False, f"{ours} vs {cpu} on the CPU in float32"
        gap = abs(ours - cpu) / cpu
        return gap <= limit, f"{ours:.4f} vs {cpu:.4f} on the CPU in float32, relative difference {gap:.1e}"

    def ranks() -> tuple[bool, str]:
        theirs = {row["layer"]: row["degradation_pct"] for row in reference.result["layers"]}
        rows = run.result["layers"]
        rho = spearman([row["degradation_pct"] for row in rows], [theirs[row["layer"]] for row in rows])
        shown = "undefined" if rho is None else f"{rho:.4f}"
        return rho is not None and rho >= SPEARMAN_BOUND, f"{shown} over {len(rows)} layers"

    def no_inf() -> tuple[bool, str]:
        rows = run.result["layers"]
        bad = [row["layer"] for row in rows if not all(finite(row[k]) for k in ("ppl", "degradation_pct"))]
        shown = f"{len(rows) - len(bad)} of {len(rows)} layers" + (f"; inf/NaN: {bad}" if bad else "")
        return not bad and finite(run.result["baseline_ppl"]), shown

    limit = BASELINE_BOUND[dtype]
    for figure, bound, verdict in ((f"map {dtype} baseline", f"<= {limit:g} relative", baseline),
                                   (f"map {dtype} D% Spearman", f">= {SPEARMAN_BOUND}", ranks)):
        if run is reference:  # the CPU dry run's float32 map: nothing to compare it with
            check.skip(figure, "the CPU float32 reference itself")
        else:
            check.judge(figure, bound, (run, reference), verdict)
    check.judge(f"map {dtype} finite layers", "no inf/NaN", (run,), no_inf)


def sync_figure(check: Check, figure: str, run: Run, event: str, bound: float, unit: str, note: str = "") -> None:
    if not gpu_only(check, figure, run):
        return

    def verdict() -> tuple[bool, str]:
        counts = unit_syncs(run, event)
        middle, most = statistics.median(counts), max(counts)
        return middle <= bound, f"median {middle:g}, max {most:g} over {len(counts)} {unit}{note}"

    check.judge(figure, f"median <= {bound:g}", (run,), verdict)


def twice(check: Check, figure: str, first: Run, again: Callable[[], Run]) -> None:
    """The same command run `again`, compared bit for bit with `first`: a GPU figure (its kernels can
    differ run to run). The CPU's give the same bits every run; the tests check its runs across
    processes (a resumed run equals an uninterrupted one, shards equal the serial map)."""
    if not check.gpu:
        check.skip(figure, "a GPU figure: the CPU's kernels give the same bits every run")
        return
    second = again()

    def verdict() -> tuple[bool, str]:
        gap, where = largest_difference(first.result, second.result)
        return gap == 0, "bitwise equal" if gap == 0 else f"largest relative difference {gap:.1e} at {where}"

    check.judge(figure, "bitwise", (first, second), verdict)


def scaler_figure(check: Check, run: Run) -> None:
    def verdict() -> tuple[bool, str]:
        scalers = run.probe["scalers"]
        if not scalers:
            return False, "no GradScaler was enabled in the float16 recovery"
        steps = sum(s["steps"] for s in scalers)
        unknown = any(s["skipped"] is None for s in scalers)
        skipped = 0 if unknown else sum(s["skipped"] for s in scalers)
        finals = [s["final"] for s in scalers]
        passed = all(math.isfinite(f) and f > 0 for f in finals) and not unknown and skipped < SKIPPED_SHARE * steps
        return passed, (f"final scale {', '.join(f'{f:g}' for f in finals)} (from {scalers[0]['first']:g}), "
                        f"{'?' if unknown else skipped} of {steps} steps skipped")

    check.judge("float16 recovery loss scale", f"finite, skipped < {SKIPPED_SHARE:.0%} of steps", (run,), verdict)


def prune_figure(check: Check, dtype: str, run: Run) -> None:
    def verdict() -> tuple[bool, str]:
        points = run.result["curve"]  # a perplexity saved as None was inf or NaN
        cut = [(p["ppl"] if finite(p["ppl"]) else math.inf, p["healed_ppl"]) for p in points]
        bad = [healed for ppl, healed in cut if not finite(healed) or healed > HEALED_RATIO * ppl]
        shown = "; ".join(f"{ppl:.3f} -> {healed if healed is None else f'{healed:.3f}'} "
                          f"({p['removed']} cut by {p['method']})"
                          for (ppl, healed), p in zip(cut, points, strict=True))
        return bool(points) and not bad, f"PPL unhealed -> healed {shown}"

    check.judge(f"prune {dtype} healing", f"finite, <= {HEALED_RATIO} x unhealed", (run,), verdict)


def oom_figure(check: Check, experiment: str, flags: list[str]) -> None:
    figure = f"out of memory in {experiment}"
    if not gpu_only(check, figure, None):
        return

    def verdict() -> tuple[bool, str]:
        run = check.run(f"oom-{experiment}", experiment, flags, env={"GPU_CHECK_OOM": "1"})
        lines = [line.strip() for line in run.stderr.replace("\r", "\n").splitlines() if line.strip()]
        named = [line for line in lines if "out of memory" in line.lower()]
        traceback = any(line.startswith("Traceback") for line in lines)
        shown = named[0][:120] if len(named) == 1 else f"{len(named)} lines name it"
        return (run.rc == 2 and len(named) == 1 and not traceback,
                f"exit {run.rc}, {shown}{'; a traceback' if traceback else ''}")

    check.judge(figure, "exit 2, one stderr line naming it, no traceback", (), verdict)


def spread_figure(check: Check, figure: str, spread: Run, one: Run) -> None:
    def verdict() -> tuple[bool, str]:
        gap, where = largest_difference(spread.result, one.result)
        return gap <= SPREAD_BOUND, f"largest relative difference {gap:.1e}" + (f" at {where}" if gap else "")

    check.judge(figure, f"<= {SPREAD_BOUND:g} relative", (spread, one), verdict)


def two_gpus(check: Check, settings: Settings, serial_map: Run) -> None:
    """With two GPUs or more: a model spread over them, a sweep split over them and the console's
    jobs, each against the same run on one GPU."""
    import torch

    gpus = torch.cuda.device_count() if check.gpu else 0
    if gpus < 2:
        check.info(f"two-GPU figures skipped: {gpus} GPU(s) visible (--device-map balanced against one GPU, "
                   "--shards 2 against serial, the console's jobs)")
        return
    auto = ["--model", check.args.model, "--dtype", "float32", "--deterministic", "--no-tf32"]  # --device auto
    for experiment, flags in (("ablation", settings.map), ("dynamics", settings.dynamics),
                              ("weights", settings.weights), ("prune", settings.prune)):
        one = serial_map if experiment == "ablation" else check.run(
            f"one-{experiment}", experiment, [*model_flags(check, "float32"), *flags])
        spread = check.run(f"balanced-{experiment}", experiment, [*auto, "--device-map", "balanced", *flags])
        spread_figure(check, f"{experiment} --device-map balanced vs one GPU", spread, one)
    sharded = check.run("shards-ablation", "ablation", [*auto, "--shards", "2", *settings.map])
    spread_figure(check, "map --shards 2 vs serial", sharded, serial_map)
    # recovery splits by (layer, repeat): two repeats give the console's job two units to share
    recovery = [*settings.recovery, "--repeats", "2"]
    serial_recovery = check.run("serial-recovery", "recovery", [*model_flags(check, "float16"), *recovery])
    console_job(check, "ablation", settings.map, "float32", serial_map)
    console_job(check, "recovery", recovery, "float16", serial_recovery)


def console_job(check: Check, experiment: str, flags: list[str], dtype: str, serial: Run) -> None:
    """The command the console starts for this experiment on a machine with several GPUs
    (cli.argv.job_argv, from the settings and model options the flags give: `--shards` over the
    visible GPUs), run as the console runs it, against the serial run on one GPU."""
    from cli.argv import job_argv
    from cli.flags import model_options_from_args, settings_from_args
    from cli.main import build_parser
    from engine.registry import BY_NAME

    figure, bound = f"console {experiment} job vs serial", f"--shards in its command, <= {SPREAD_BOUND:g} relative"

    def verdict() -> tuple[bool, str]:
        args = build_parser(experiment).parse_args(["run", experiment, *model_flags(check, dtype, "cuda"), *flags])
        argv = job_argv(experiment, settings_from_args(BY_NAME[experiment], args), model_options_from_args(args),
                        f"console-{experiment}", False)
        shards = [word for word in argv if word.startswith("--shards")]
        if not shards:
            return False, f"no --shards in the job's command: {' '.join(argv[3:])}"
        job = check.run(f"console-{experiment}", experiment, [], argv=argv)
        if job.error:
            return False, job.error
        gap, where = largest_difference(job.result, serial.result)
        shown = f"{shards[0]}, largest relative difference {gap:.1e}" + (f" at {where}" if gap else "")
        return gap <= SPREAD_BOUND, shown

    check.judge(figure, bound, (serial,), verdict)


def before_torch_figures(check: Check) -> None:
    """`run --help` and a layer out of range answered before torch or transformers is imported."""
    for figure, argv, code in (("run --help before torch", ["run", "--help"], 0),
                               ("--layers 99 refused before torch",
                                ["run", "recovery", "--model", check.args.model, "--layers", "99"], 2)):
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-X", "importtime", "-m", "cli.main", *argv], cwd=ROOT,
                              capture_output=True, text=True, timeout=check.args.timeout,
                              env={**os.environ, "ANATOMY_TUI_HOME": str(check.work / "sessions")})
        seconds = time.perf_counter() - started  # -X importtime adds a little
        imported = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines()
                    if line.startswith("import time:")}
        heavy = sorted(imported & {"torch", "transformers"})
        check.verdict(figure, done.returncode == code and not heavy,
                      f"exit {done.returncode} in {seconds:.1f} s, imported {', '.join(heavy) or 'neither'}",
                      f"exit {code}, neither torch nor transformers imported")


def figures(check: Check) -> None:
    """Every figure, in the order of issue 18's list (and issue 31's answers before torch)."""
    args = check.args
    device_info(check)
    before_torch_figures(check)
    n_layers = layer_count(args.model)
    settings = Settings.choose(args.quick, n_layers)
    check.info(f"model {args.model}, {n_layers} layers; map: {' '.join(settings.map) or 'defaults'}; "
               f"recovery: {' '.join(settings.recovery)}")

    reference = check.run("map-cpu-float32", "ablation", [*model_flags(check, "float32", "cpu"), *settings.map])
    maps = {}
    for dtype in DTYPES:  # on the CPU, float32's map is the reference's own command: that run
        on_reference = not check.gpu and dtype == "float32"
        maps[dtype] = reference if on_reference else check.run(f"map-{dtype}", "ablation",
                                                               [*model_flags(check, dtype), *settings.map])
        map_figures(check, dtype, maps[dtype], reference)
        peak_figure(check, f"peak/plan map {dtype}", maps[dtype])
    batches = _evaluation_batches(maps["float32"])
    sync_figure(check, "host syncs per ablated layer", maps["float32"], "Progress", 2 + 3 * batches, "layers",
                f", {batches} evaluation batch(es) each")
    twice(check, "map twice (float32)", maps["float32"],
          lambda: check.run("map-float32-again", "ablation", [*model_flags(check, "float32"), *settings.map]))

    recovery_flags = [*model_flags(check, "float16"), *settings.recovery]
    recovery = check.run("recovery-float16", "recovery", recovery_flags)
    peak_figure(check, "peak/plan recovery float16", recovery)
    sync_figure(check, "host syncs per recovery step", recovery, "Progress", SYNCS_PER_STEP["recovery"], "steps")
    scaler_figure(check, recovery)
    twice(check, "recovery twice (float16)", recovery,
          lambda: check.run("recovery-float16-again", "recovery", recovery_flags))

    growth_flags = ["--device", args.device, "--dtype", "float16", *settings.growth]
    growth = check.run("growth-float16", "growth", growth_flags)
    sync_figure(check, "host syncs per growth step", growth, "GrowthEval", SYNCS_PER_STEP["growth"],
                "validation intervals")

    for dtype in ("float16", "float32"):
        prune_figure(check, dtype, check.run(f"prune-{dtype}", "prune", [*model_flags(check, dtype), *settings.prune]))

    for experiment, flags in (("ablation", [*model_flags(check, "float32"), *settings.map]),
                              ("recovery", [*model_flags(check, "float16"), *settings.recovery]),
                              ("growth", growth_flags),
                              ("prune", [*model_flags(check, "float16"), *settings.prune])):
        oom_figure(check, experiment, flags)

    two_gpus(check, settings, maps["float32"])
    streamed_figures(check)


def streamed_figures(check: Check) -> None:
    """Issue 42's streamed map on the card, a model twice its budget (benchmarks/streamed_gpu.py): its
    lines, counted as this check's."""
    command = [sys.executable, str(ROOT / "benchmarks" / "streamed_gpu.py"), "--device", check.args.device,
               "--work", str(check.work), "--timeout", str(check.args.timeout),
               *(["--quick"] if check.args.quick else [])]
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=3 * check.args.timeout)
    except subprocess.TimeoutExpired:
        check.verdict("streamed map", False, f"timed out after {3 * check.args.timeout} s", "runs to the end")
        return
    for line in done.stdout.splitlines():
        status, _, text = line.partition(" ")
        if status == "INFO":
            check.info(text)
        elif status in ("PASS", "FAIL"):
            check._line(status, text)
    if done.returncode not in (0, 1) or not done.stdout:
        said = (done.stderr.strip().splitlines() or [""])[-1][:160]
        check.verdict("streamed map", False, f"exited {done.returncode}: {said}", "runs to the end")


def _evaluation_batches(run: Run) -> int:
    """Evaluation batches of one ablated layer: the texts over the batch size the plan recorded."""
    if run.result is None or not run.plan or not run.plan.get("eval_batch_size"):
        return 1
    return math.ceil(run.result["eval_texts"] / run.plan["eval_batch_size"])


def main() -> int:
    warnings.filterwarnings("ignore")  # figures only: a library's warning is no line of this check
    os.environ.update(QUIET)
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu",
                        help="cuda:N, or cpu for the dry run (default: cuda:0 when there is a GPU)")
    parser.add_argument("--quick", action="store_true", help="a few layers, few steps, short texts")
    parser.add_argument("--model", default="smollm2-135m", help="smollm2-135m (embedded), or a Hugging Face folder")
    parser.add_argument("--timeout", type=int, default=600, help="seconds one run may take (default 600)")
    args = parser.parse_args()
    if Path(args.model).exists():  # a folder: runs start in the checkout, not where this was typed
        args.model = str(Path(args.model).resolve())
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
        check = Check(args, Path(work))
        try:
            figures(check)
        except Exception as exc:  # the check's own mistake: one FAIL line, never a traceback
            check.verdict("gpu check", False, f"stopped: {type(exc).__name__}: {str(exc)[:200]}", "runs to the end")
        check.info("seconds per run: " + ", ".join(f"{name} {took:.0f}" for name, took in check.clock.items()))
    counts = check.counts
    print(f"SUMMARY {counts['PASS']} PASS, {counts['FAIL']} FAIL, {counts['SKIP']} SKIP in "
          f"{time.perf_counter() - started:.0f} s", flush=True)
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
