"""The GPU check (benchmarks/gpu_check.sh): its CPU dry run on a tiny saved model prints only verdict
lines and a summary, and exits 0 exactly when nothing failed; the GPU-only verdicts, fed the runs a
GPU would give, judge as their bounds say (no GPU is needed to check the judging)."""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_models import save_tiny

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"(?:(?:PASS|FAIL) [^:]+: .+ \(.+\)|SKIP [^:]+: .+|INFO .+)")
SUMMARY = re.compile(r"SUMMARY (\d+) PASS, (\d+) FAIL, (\d+) SKIP in \d+ s")


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    assert spec is not None and spec.loader is not None  # a .py file's location always has a loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_cpu_dry_run_on_a_tiny_model(tmp_path):
    model = save_tiny(tmp_path / "tiny")
    done = subprocess.run([str(ROOT / "benchmarks" / "gpu_check.sh"), "--device", "cpu", "--quick", "--model",
                           str(model)], capture_output=True, text=True, timeout=900)
    lines = done.stdout.splitlines()
    assert done.stderr == "" and "Traceback" not in done.stdout
    assert lines and all(LINE.fullmatch(line) for line in lines[:-1]), done.stdout
    summary = SUMMARY.fullmatch(lines[-1])
    assert summary, lines[-1]
    status = [line.split(" ", 1)[0] for line in lines[:-1]]
    assert [int(n) for n in summary.groups()] == [status.count(s) for s in ("PASS", "FAIL", "SKIP")]
    assert done.returncode == (1 if "FAIL" in status else 0), done.stdout
    figures = [line.split(" ", 1)[1].split(":", 1)[0] for line in lines[:-1] if not line.startswith("INFO")]
    assert len(figures) == len(set(figures)), "one line per figure"
    for dtype in ("float32", "float16", "bfloat16"):
        assert {f"map {dtype} baseline", f"map {dtype} D% Spearman", f"map {dtype} finite layers"} <= set(figures)
    assert {"map twice (float32)", "recovery twice (float16)", "float16 recovery loss scale",
            "prune float16 healing", "prune float32 healing", "run --help before torch",
            "--layers 99 refused before torch", "streamed bytes read",
            "streamed map equals in memory (float32)"} <= set(figures)  # benchmarks/streamed_gpu.py's, relayed
    skipped = {line.split(" ", 1)[1].split(":", 1)[0] for line in lines if line.startswith("SKIP")}
    assert skipped == {"map twice (float32)", "recovery twice (float16)", "map float32 baseline",
                       "map float32 D% Spearman", "peak/plan map float32", "peak/plan map float16",
                       "peak/plan map bfloat16",
                       "peak/plan recovery float16", "host syncs per ablated layer", "host syncs per recovery step",
                       "host syncs per growth step", "out of memory in ablation", "out of memory in recovery",
                       "out of memory in growth", "out of memory in prune"}
    assert any(line.startswith("INFO two-GPU figures skipped") for line in lines)


def _gpu(tmp_path):
    gpu_check = _gpu_check()
    args = argparse.Namespace(device="cuda:0", quick=True, model="tiny", timeout=60)
    return gpu_check, gpu_check.Check(args, tmp_path)


def _run(gpu_check, **fields):
    base = dict(name="run", rc=0, stderr="", result={}, plan={"total": 1000}, probe={}, seconds=1.0)
    return gpu_check.Run(**{**base, **fields})


def test_gpu_verdicts_judge_by_their_bounds(tmp_path, capsys):
    gpu_check, check = _gpu(tmp_path)
    gpu_check.peak_figure(check, "peak/plan map float32", _run(gpu_check, probe={"peak": 900}))
    gpu_check.peak_figure(check, "peak/plan map float16", _run(gpu_check, probe={"peak": 1200}))
    events = [["Progress", i, 3 * i] for i in range(4)]  # 3 syncs a layer
    gpu_check.sync_figure(check, "host syncs per ablated layer", _run(gpu_check, probe={"events": events}),
                          "Progress", 5, "layers")
    evals = [["GrowthEval", 10, 5], ["GrowthEval", 20, 105]]  # 100 syncs over 10 steps
    gpu_check.sync_figure(check, "host syncs per growth step", _run(gpu_check, probe={"events": evals}),
                          "GrowthEval", 5, "intervals")
    scalers = [{"first": 4096.0, "final": 2048.0, "steps": 20, "skipped": 1}]
    gpu_check.scaler_figure(check, _run(gpu_check, probe={"scalers": scalers}))
    gpu_check.peak_figure(check, "peak/plan recovery float16", _run(gpu_check, rc=2, stderr="anatomy-tui: error: x"))
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "PASS peak/plan map float32", "FAIL peak/plan map float16", "PASS host syncs per ablated layer",
        "FAIL host syncs per growth step", "PASS float16 recovery loss scale", "FAIL peak/plan recovery float16"]
    assert "median 3, max 3 over 3 layers" in lines[2] and "median 10" in lines[3]
    assert "run exited 2: anatomy-tui: error: x" in lines[5]


@pytest.mark.parametrize(("rc", "stderr", "passed"), [
    (2, "memory plan on cuda:0 ...\nanatomy-tui: error: out of memory in ablation; try a smaller --eval-batch-size\n",
     True),
    (0, "", False),  # nothing ran out
    (2, "Traceback (most recent call last):\ntorch.OutOfMemoryError: CUDA out of memory\n", False),
    (2, "out of memory\nanatomy-tui: error: out of memory in ablation\n", False),  # two lines
])
def test_out_of_memory_verdict(tmp_path, capsys, rc, stderr, passed):
    gpu_check, check = _gpu(tmp_path)
    check.run = lambda *args, **kwargs: _run(gpu_check, rc=rc, stderr=stderr)
    gpu_check.oom_figure(check, "ablation", [])
    assert capsys.readouterr().out.startswith("PASS" if passed else "FAIL")


def test_results_compare_by_their_numbers_not_their_clocks():
    gpu_check = _gpu_check()
    doc = {"baseline_ppl": 10.0, "seconds": 3.0, "layers": [{"layer": 0, "ppl": 12.0, "seconds_per_step": 1.0}]}
    assert gpu_check.largest_difference(doc, {**doc, "seconds": 9.0}) == (0.0, "")
    other = {**doc, "layers": [{"layer": 0, "ppl": 12.0 * (1 + 1e-6), "seconds_per_step": 2.0}]}
    gap, where = gpu_check.largest_difference(doc, other)
    assert where == "layers[0].ppl" and gap == pytest.approx(1e-6, rel=1e-3)
    assert gpu_check.largest_difference(doc, {**doc, "layers": []})[0] == float("inf")


def test_two_gpu_figures_run_what_the_issue_lists(tmp_path, capsys, monkeypatch):
    """With two GPUs (faked: the runs are recorded, not made): a model spread by --device-map against
    one GPU for four experiments, --shards 2 against the serial map, and the console's map and
    recovery jobs, whose commands carry --shards=2."""
    import torch

    gpu_check, check = _gpu(tmp_path)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    commands = {}

    def run(name, experiment, flags, env=None, argv=None):
        commands[name] = argv or flags
        return _run(gpu_check, name=name, result={"baseline_ppl": 10.0})

    check.run = run
    settings = gpu_check.Settings.choose(True, 4)
    gpu_check.two_gpus(check, settings, _run(gpu_check, result={"baseline_ppl": 10.0}))
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        *(f"PASS {e} --device-map balanced vs one GPU" for e in ("ablation", "dynamics", "weights", "prune")),
        "PASS map --shards 2 vs serial", "PASS console ablation job vs serial", "PASS console recovery job vs serial"]
    assert all("--device-map" in commands[f"balanced-{e}"] for e in ("ablation", "dynamics", "weights", "prune"))
    assert "--shards" in commands["shards-ablation"]
    for experiment in ("ablation", "recovery"):
        job = commands[f"console-{experiment}"]
        assert job[1] == "-c" and job[3:5] == ["run", experiment] and "--shards=2" in job


def test_inf_or_nan_saved_as_none_is_judged_not_a_check_error(tmp_path, capsys):
    gpu_check, check = _gpu(tmp_path)
    rows = [{"layer": i, "ppl": 11.0 + i, "degradation_pct": 10.0 * i} for i in range(3)]
    reference = _run(gpu_check, result={"baseline_ppl": 10.0, "layers": rows})
    broken = _run(gpu_check, result={"baseline_ppl": None, "layers": [{**row, "ppl": None} for row in rows]})
    gpu_check.map_figures(check, "float16", broken, reference)
    for dtype, ppl, healed in (("float16", None, 9.0), ("float32", 9.0, None)):  # unhealed inf; healed inf
        point = {"removed": 2, "method": "bi", "ppl": ppl, "healed_ppl": healed}
        gpu_check.prune_figure(check, dtype, _run(gpu_check, result={"curve": [point]}))
    lines = capsys.readouterr().out.splitlines()
    assert [line[:4] for line in lines] == ["FAIL", "PASS", "FAIL", "PASS", "FAIL"]
    assert not any("check error" in line for line in lines)


def test_twice_runs_again_and_compares_bits_on_a_gpu_only(tmp_path, capsys):
    gpu_check, check = _gpu(tmp_path)
    doc = {"baseline_ppl": 10.0, "layers": [{"layer": 0, "ppl": 12.0}]}
    first = _run(gpu_check, result=doc)
    gpu_check.twice(check, "map twice (float32)", first, lambda: _run(gpu_check, result=doc))
    changed = {**doc, "layers": [{"layer": 0, "ppl": 12.5}]}
    gpu_check.twice(check, "recovery twice (float16)", first, lambda: _run(gpu_check, result=changed))
    check.args.device = "cpu"  # the dry run: no second run at all
    gpu_check.twice(check, "map twice (float32)", first, lambda: pytest.fail("the CPU ran it again"))
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["PASS map twice (float32)", "FAIL recovery twice (float16)",
                                                      "SKIP map twice (float32)"]
    assert "bitwise equal" in lines[0] and "at layers[0].ppl" in lines[1]
