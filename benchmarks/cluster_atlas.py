"""An atlas of several small models on a local Ray cluster against the serial atlas (issue 32).

    python benchmarks/cluster_atlas.py [--models 4] [--texts 150]

Small random models of two families (llama, qwen2; hidden 128, 6 layers, the tests' byte
tokenizer), each measured by `anatomy-tui atlas --measures map,proxies` on the same evaluation file:
once serially (`--device cpu`, one model after another in one process tree), once with
`--cluster local` (Ray started by the command on this machine's CPUs: one task of one CPU per
model). Each is a command of its own, timed from its start to its end (Ray's start-up and its
workers' imports included), in a store of its own, and the two tables are checked equal. Torch
gets one thread in every process, so the cluster's gain is its tasks side by side. The last line
is `ratio cluster_atlas: X` (serial seconds / cluster seconds).
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def make_models(folder: Path, count: int) -> list[str]:
    import torch
    from tiny_models import byte_tokenizer
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    paths = []
    for index in range(count):
        family = (LlamaConfig, Qwen2Config)[index % 2]
        config = family(vocab_size=260, hidden_size=128, intermediate_size=256, num_hidden_layers=6,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, pad_token_id=256,
                        bos_token_id=257, eos_token_id=258)
        torch.manual_seed(index)
        path = folder / f"model{index}-{family.model_type}"
        AutoModelForCausalLM.from_config(config).save_pretrained(path)
        byte_tokenizer().save_pretrained(path)
        paths.append(str(path))
    return paths


def timed_atlas(models: list[str], evaluation: Path, home: Path, extra: list[str]) -> tuple[float, list[dict]]:
    env = {**os.environ, "ANATOMY_TUI_HOME": str(home), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "cli.main", "atlas", "--models", ",".join(models), "--name", "bench",
            "--eval-file", str(evaluation), "--measures", "map,proxies", "--bins", "4", *extra]
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"atlas {' '.join(extra)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    rows = json.loads((home / "bench" / "results" / "atlas.json").read_text())["rows"]
    return seconds, [{k: v for k, v in row.items() if k != "session"} for row in rows]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", type=int, default=4)
    parser.add_argument("--texts", type=int, default=150, help="evaluation texts (each model's work)")
    args = parser.parse_args()
    from tiny_models import EVAL

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        models = make_models(folder, args.models)
        evaluation = folder / "eval.txt"
        evaluation.write_text("\n".join(f"{EVAL[i % len(EVAL)]} ({i})" for i in range(args.texts)), encoding="utf-8")
        serial, serial_rows = timed_atlas(models, evaluation, folder / "serial", ["--device", "cpu"])
        print(f"serial atlas, {args.models} models: {serial:.1f} s", flush=True)
        cluster, cluster_rows = timed_atlas(models, evaluation, folder / "cluster", ["--cluster", "local"])
        print(f"atlas on a local Ray cluster ({os.cpu_count()} CPUs): {cluster:.1f} s", flush=True)
        assert cluster_rows == serial_rows, "the cluster's table differs from the serial one"
        print(f"tables equal: {len(serial_rows)} rows")
        print(f"ratio cluster_atlas: {serial / cluster:.2f}")


if __name__ == "__main__":
    main()
