"""`python3 -m cli.main run ...` with the GPU check's measurements: what `benchmarks/gpu_check.py` runs.

    GPU_CHECK_REPORT=FILE [GPU_CHECK_DEVICE=cuda:0] [GPU_CHECK_OOM=1] python3 benchmarks/gpu_probe.py run EXPERIMENT ...

The command is the user's (`cli.main.main`: flags, memory plan, model load, session, result); this
wrapper only watches it and writes FILE (JSON) when it ends:
- `peak`: torch.cuda.max_memory_allocated() of GPU_CHECK_DEVICE over the whole process (the load
  included), when that is a CUDA device.
- `events`: [event class, its `done` or `step`, host syncs so far] for every event the experiment
  yields. Syncs are counted from the experiment's start (after the model load) with
  torch.cuda.set_sync_debug_mode("warn"): CUDA warns once per synchronizing call (a read to the
  host, a blocking copy), and each warning is counted here instead of printed. CUDA only.
- `scalers`: every enabled GradScaler (float16 training): its first and final loss scale and its
  steps; `skipped` steps follow from the scale, which halves on each skipped step and cannot grow
  within fewer than growth_interval (2000) steps.
With GPU_CHECK_OOM=1 the process may hold no more GPU memory than it holds when the experiment
starts (torch.cuda.set_per_process_memory_fraction, after empty_cache): the experiment's first new
allocation runs out of memory on the GPU for real, which the run must report in one line.
"""

from __future__ import annotations

import json
import math
import os
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, not an installed copy

import torch  # noqa: E402

from engine.registry import Experiment  # noqa: E402

SYNC_WARNING = "called a synchronizing CUDA operation"  # torch's words (c10/cuda/CUDAFunctions.cpp)
DEVICE = os.environ.get("GPU_CHECK_DEVICE", "cpu")
ON_CUDA = DEVICE.startswith("cuda") and torch.cuda.is_available()
report: dict = {"peak": None, "events": [], "scalers": []}
syncs = 0
scalers: list = []


def _count_syncs() -> None:
    """Sync warnings are counted, every one of them ("always": the default shows a place once),
    and never printed; other warnings go where they went."""
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        global syncs
        if SYNC_WARNING in str(message):
            syncs += 1
            return
        shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    warnings.filterwarnings("always", message=SYNC_WARNING)


def _watch_experiments() -> None:
    original = Experiment.run

    def run(self, settings, context):
        if ON_CUDA and os.environ.get("GPU_CHECK_OOM") == "1":
            torch.cuda.synchronize(DEVICE)
            torch.cuda.empty_cache()
            held = max(torch.cuda.memory_reserved(DEVICE), 2**20)
            torch.cuda.set_per_process_memory_fraction(held / torch.cuda.get_device_properties(DEVICE).total_memory,
                                                       DEVICE)
        if ON_CUDA:
            torch.cuda.set_sync_debug_mode("warn")
        try:
            for event in original(self, settings, context):
                mark = getattr(event, "done", getattr(event, "step", None))
                report["events"].append([type(event).__name__, mark, syncs])
                yield event
        finally:
            if ON_CUDA:
                torch.cuda.set_sync_debug_mode("default")

    Experiment.run = run


def _watch_scalers() -> None:
    scaler_class = torch.amp.GradScaler
    init, update = scaler_class.__init__, scaler_class.update

    def watched_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if self.is_enabled():
            self.gpu_check = {"first": self.get_scale(), "steps": 0}  # no sync: the scale is not made yet
            scalers.append(self)

    def watched_update(self, *args, **kwargs):
        update(self, *args, **kwargs)
        if hasattr(self, "gpu_check"):
            self.gpu_check["steps"] += 1

    scaler_class.__init__, scaler_class.update = watched_init, watched_update


def _scaler_report(scaler) -> dict:
    first, final, steps = scaler.gpu_check["first"], scaler.get_scale(), scaler.gpu_check["steps"]
    skipped = None
    if steps < scaler.get_growth_interval() and final > 0 and math.isfinite(final):
        skipped = round(math.log(first / final, 1 / scaler.get_backoff_factor()))
    return {"first": first, "final": final, "steps": steps, "skipped": skipped}


def main() -> int:
    _count_syncs()
    _watch_experiments()
    _watch_scalers()
    from cli.main import main as cli

    code = 1
    try:
        code = cli()  # its command line, as `anatomy-tui` takes it (a process of one job)
    finally:
        report["exit"] = code
        if ON_CUDA and torch.cuda.is_initialized():
            report["peak"] = torch.cuda.max_memory_allocated(DEVICE)
        report["scalers"] = [_scaler_report(scaler) for scaler in scalers]
        Path(os.environ["GPU_CHECK_REPORT"]).write_text(json.dumps(report))
    return code


if __name__ == "__main__":
    sys.exit(main())
