"""The GPU check's streamed entry (benchmarks/streamed_gpu.py), dry run on the CPU: a tiny random
Llama written to disk, mapped streamed under a budget and in memory, prints its figures' lines in the
GPU check's format; no timing is judged, only that each figure is there and what the maps say."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"(?:(?:PASS|FAIL) [^:]+: .+ \(.+\)|INFO .+)")


@pytest.mark.slow
def test_cpu_quick_dry_run_prints_every_figure(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "streamed_gpu.py"), "--device", "cpu", "--quick",
                           "--work", str(tmp_path)], capture_output=True, text=True, timeout=900)
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    assert lines and all(LINE.fullmatch(line) for line in lines), done.stdout
    text = "\n".join(lines)
    assert re.search(r"^INFO streamed model: random Llama, 8 layers of hidden 128, [\d.]+ GB bfloat16 file", text, re.M)
    assert re.search(r"^INFO disk cold read: [\d.]+ GB/s", text, re.M)
    read = re.search(r"^PASS streamed bytes read: ([\d,]+) of the checkpoint's ([\d,]+) tensor bytes .* (\d+) of (\d+) "
                     r"tensors, each read at most 1x", text, re.M)
    assert read and read[1] == read[2] and read[3] == read[4], text
    # 8 layers of 9 tensors, embedding, head and final norm: 75 tensors of the bfloat16 file
    assert int(read[3]) == 8 * 9 + 3
    assert re.search(r"^INFO streamed disk rate: [\d.]+ GB/s in the reader thread \([\d.]+x the disk's cold read\)",
                     text, re.M)
    share = re.search(r"^INFO CPU share of wall in layer forwards: streamed ([\d.]+)% of .*, in memory ([\d.]+)% of",
                      text, re.M)
    assert share and 0 < float(share[1]) <= 100 and 0 < float(share[2]) <= 100, text
    assert re.search(r"^INFO wall streamed/in-memory: [\d.]+x", text, re.M)
    assert re.search(r"^PASS streamed map equals in memory \(float32\): largest relative perplexity difference "
                     r"\S+ over 8 layers, classes identical", text, re.M)
    assert not re.search(r"^(FAIL|SKIP)", text, re.M)


def test_the_model_is_about_twice_the_budget():
    """The full model's depth from a 3 GiB budget in bfloat16: Llama-3-8B's layer (218,112,000
    parameters with 8 key-value heads of 128) and a 32,000-word vocabulary, untied."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    streamed_gpu = importlib.import_module("streamed_gpu")  # a script of benchmarks/, not a package

    assert streamed_gpu.FULL.layer_params() == 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    layers = streamed_gpu.depth_for(streamed_gpu.FULL, 3 * 2**30, 2)
    size = 2 * (layers * 218_112_000 + 2 * 32_000 * 4096 + 4096)
    assert layers == 14 and 1.9 < size / (3 * 2**30) < 2.1
