"""The streamed map on a GPU (issue 42), an entry of benchmarks/gpu_check.sh: a model twice the budget.

    python3 benchmarks/streamed_gpu.py [--device cuda:0] [--quick] [--budget-gib 3] [--work DIR]

A random Llama-shaped model (transformers' LlamaConfig, Llama-3-8B's layer shape, normal weights of
std 0.02) of about twice `--budget-gib` in the run's dtype (3 GiB: 14 layers, 6.6 GB; with --quick
on a GPU, hidden 2048 and a 1 GiB budget: 15 layers, 2.2 GB; on the CPU a tiny one of 8 layers) is
written to local disk as bfloat16 safetensors; the disk's own read speed is measured on it cold
(posix_fadvise DONTNEED, then one sequential read). The streamed map (the engine call that
`run ablation --stream --max-memory` makes: `open_streamed` with the budget, then
`run_ablation(stream=...)`) runs in a fresh process with the file's pages dropped again, then the
in-memory map (`load_model`, `run_ablation`) where the card holds the model; neighbour mean, the
paper's 10 texts, a batch of 8 for both. Prints gpu_check's lines, `INFO ...` and
`PASS|FAIL <figure>: <value> (<bound>)`:

- bytes read against the checkpoint's tensors (each tensor once) and the file's size;
- the disk's GB/s in the map (the reader thread's, and over the map's wall) against the cold read's;
- the share of the map's wall time in decoder-layer forwards (CUDA events around each layer's
  forward on a GPU, the clock on the CPU), for both maps;
- wall streamed / in memory (each from the model's opening to its map's result);
- the two maps equal: largest relative perplexity difference, 1e-3 in float16/bfloat16, 1e-5 in
  float32, classes identical; on a GPU, the streamed map's device peak within its budget.

`--device cpu --quick` (a tiny model, float32) is its dry run, tested by tests/test_streamed_gpu.py.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the byte tokenizer of the tiny models

BOUND = {"float32": 1e-5, "float16": 1e-3, "bfloat16": 1e-3}
GIB = 2**30


@dataclass(frozen=True)
class Shape:
    """A Llama's shape: the full one is Llama-3-8B's layer (436 MB in 16 bits) with a 32k vocabulary."""

    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int

    def layer_params(self) -> int:
        head_dim = self.hidden // self.heads
        return (2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_heads * head_dim
                + 3 * self.hidden * self.intermediate + 2 * self.hidden)

    def outer_params(self) -> int:
        return 2 * self.vocab * self.hidden + self.hidden  # embedding, untied head, final norm


FULL = Shape(hidden=4096, intermediate=14336, heads=32, kv_heads=8, vocab=32000)
SMALL = Shape(hidden=2048, intermediate=8192, heads=16, kv_heads=8, vocab=32000)  # --quick on a GPU
TINY = Shape(hidden=128, intermediate=344, heads=4, kv_heads=2, vocab=512)  # --quick on the CPU
BUDGET_GIB = {FULL: 3.0, SMALL: 1.0, TINY: 0.025}


def depth_for(shape: Shape, budget: int, element: int) -> int:
    """Layers that make the model about twice `budget` bytes in the run's dtype (at least 8)."""
    return max(8, round((2 * budget / element - shape.outer_params()) / shape.layer_params()))


def write_model(folder: Path, shape: Shape, layers: int, device: str) -> float:
    """The random model as bfloat16 safetensors (its tensors drawn on `device`), config and tokenizer;
    the seconds it took (imports not counted)."""
    import torch
    from safetensors.torch import save_file
    from tiny_models import byte_tokenizer
    from transformers import LlamaConfig

    from engine.models.streaming import skeleton_model

    config = LlamaConfig(hidden_size=shape.hidden, intermediate_size=shape.intermediate, num_hidden_layers=layers,
                         num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads, vocab_size=shape.vocab,
                         max_position_embeddings=4096, tie_word_embeddings=False, bos_token_id=257,
                         eos_token_id=258, pad_token_id=256)
    began = time.perf_counter()
    generator = torch.Generator(device).manual_seed(0)
    tensors = {}
    for name, meta in skeleton_model(config, torch.bfloat16).state_dict().items():
        if name.endswith("norm.weight"):
            tensors[name] = torch.ones(meta.shape, dtype=torch.bfloat16)
        else:
            drawn = torch.empty(meta.shape, device=device, dtype=torch.bfloat16).normal_(0, 0.02, generator=generator)
            tensors[name] = drawn.cpu()
    folder.mkdir(parents=True)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config.save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    return time.perf_counter() - began


def drop_pages(path: Path) -> None:
    """The file's pages out of the page cache (written back first), so the next read is the disk's."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def disk_read(path: Path) -> float:
    """GB/s of one cold sequential read of the file (16 MiB at a time)."""
    drop_pages(path)
    chunk = bytearray(16 * 2**20)
    total, began = 0, time.perf_counter()
    with open(path, "rb", buffering=0) as handle:
        while read := handle.readinto(chunk):
            total += read
    return total / (time.perf_counter() - began) / 1e9


class LayerClock:
    """Seconds spent in decoder-layer forwards: CUDA events around each forward on a GPU (summed once
    the map is done), the clock on the CPU."""

    def __init__(self, layers: Any, cuda: bool) -> None:
        import torch

        self.torch, self.cuda = torch, cuda
        self.pairs: list[tuple[Any, Any]] = []
        self.cpu_seconds = 0.0
        self._start: Any = None
        for layer in layers:
            layer.register_forward_pre_hook(self._begin)
            layer.register_forward_hook(self._end)

    def _mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = self.torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _begin(self, *_: Any) -> None:
        self._start = self._mark()  # a forward stopped before its end (the recording pass's) is overwritten

    def _end(self, *_: Any) -> None:
        end = self._mark()
        if self.cuda:
            self.pairs.append((self._start, end))
        else:
            self.cpu_seconds += end - self._start

    def seconds(self) -> float:
        if not self.cuda:
            return self.cpu_seconds
        self.torch.cuda.synchronize()
        return sum(start.elapsed_time(end) for start, end in self.pairs) / 1000


def child(mode: str, folder: str, device: str, dtype: str, budget: str) -> None:
    """One map in this process; its figures as one JSON line on stdout."""
    import torch

    from engine.core.events import Result
    from engine.experiments.ablation.run import run_ablation
    from engine.experiments.ablation.vocabulary import AblationSettings
    from engine.models.anatomy import LayerStack
    from engine.models.loading import load_model
    from engine.models.streaming import open_streamed

    cuda = device.startswith("cuda")
    settings = AblationSettings(eval_set="paper", method="mean", eval_batch_size=8)
    figures: dict[str, Any] = {}
    began = time.perf_counter()
    loaded = open_streamed(folder, device=device, dtype=dtype, max_memory=budget) if mode == "stream" else \
        load_model(folder, device=device, dtype=dtype)
    stream = getattr(loaded, "stream", None)
    if stream is not None:
        figures["checkpoint_bytes"] = stream.checkpoint_bytes()
    clock = LayerClock(LayerStack(loaded.model).layers, cuda)
    events = list(run_ablation(loaded.model, loaded.tokenizer, settings, stream=stream))
    result = next(e for e in reversed(events) if isinstance(e, Result)).data
    if cuda:
        torch.cuda.synchronize()
    figures["seconds"] = time.perf_counter() - began
    figures["compute_seconds"] = clock.seconds()
    figures["rows"] = [(row["ppl"], row["layer_class"]) for row in result["layers"]]
    figures["device_peak"] = torch.cuda.max_memory_allocated() if cuda else None
    if stream is not None:
        figures.update(bytes_read=stream.bytes_read, read_seconds=stream.read_seconds,
                       most_reads=max(stream.reads.values()), keys_read=len(stream.reads),
                       keys=sum(len(slots) for slots in stream.slots.values()))
        stream.close()
    print(json.dumps(figures))


def run_child(mode: str, folder: Path, device: str, dtype: str, budget: str, timeout: int) -> dict[str, Any]:
    done = subprocess.run([sys.executable, __file__, "--child", mode, str(folder), "--device", device, "--dtype",
                           dtype, "--max-memory", budget], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        raise RuntimeError(f"the {mode} map exited {done.returncode}: {lines[-1][:200] if lines else ''}")
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def line(status: str, text: str) -> None:
    print(f"{status} {text}", flush=True)


def verdict(figure: str, passed: bool, value: str, bound: str) -> bool:
    line("PASS" if passed else "FAIL", f"{figure}: {value} ({bound})")
    return passed


def measure(args: argparse.Namespace, work: Path) -> bool:
    """Writes the model, runs both maps, prints the lines; whether every verdict passed."""
    import torch

    cuda = args.device.startswith("cuda")
    dtype = args.dtype or ("bfloat16" if cuda else "float32")
    element = torch.finfo(getattr(torch, dtype)).bits // 8
    shape = FULL if not args.quick else SMALL if cuda else TINY
    args.budget_gib = args.budget_gib or BUDGET_GIB[shape]
    budget = int(args.budget_gib * GIB)
    layers = 8 if shape == TINY else depth_for(shape, budget, element)  # the dry run's budget: the plan's minimum
    budget_text = f"{torch.device(args.device).index or 0}={args.budget_gib}GiB" if cuda else \
        f"cpu={args.budget_gib}GiB"
    folder = work / "random-llama"
    seconds = write_model(folder, shape, layers, args.device)
    path = folder / "model.safetensors"
    size = path.stat().st_size
    in_run_dtype = (shape.outer_params() + layers * shape.layer_params()) * element
    line("INFO", f"streamed model: random Llama, {layers} layers of hidden {shape.hidden}, {size / 1e9:.3f} GB "
                 f"bfloat16 file written in {seconds:.1f} s; {in_run_dtype / GIB:.2f} GiB in "
                 f"{dtype}, {in_run_dtype / budget:.2f}x the budget --max-memory {budget_text}")
    disk = disk_read(path)
    line("INFO", f"disk cold read: {disk:.2f} GB/s ({size / 1e9:.3f} GB after posix_fadvise DONTNEED)")
    drop_pages(path)
    streamed = run_child("stream", folder, args.device, dtype, budget_text, args.timeout)
    free = torch.cuda.mem_get_info(torch.device(args.device))[0] if cuda else None
    memory = None
    if free is None or free > 1.5 * in_run_dtype:
        memory = run_child("memory", folder, args.device, dtype, budget_text, args.timeout)
    else:
        line("INFO", f"in-memory map not run: {free / GIB:.1f} GiB free on {args.device} for a "
                     f"{in_run_dtype / GIB:.1f} GiB model")
    ok = verdict("streamed bytes read", streamed["bytes_read"] == streamed["checkpoint_bytes"]
                 and streamed["most_reads"] == 1 and streamed["keys_read"] == streamed["keys"],
                 f"{streamed['bytes_read']:,} of the checkpoint's {streamed['checkpoint_bytes']:,} tensor bytes "
                 f"({streamed['bytes_read'] / size:.4f} of the {size:,}-byte file), {streamed['keys_read']} of "
                 f"{streamed['keys']} tensors, each read at most {streamed['most_reads']}x", "each tensor once")
    reader = streamed["bytes_read"] / max(streamed["read_seconds"], 1e-9) / 1e9
    wall = streamed["bytes_read"] / streamed["seconds"] / 1e9
    line("INFO", f"streamed disk rate: {reader:.2f} GB/s in the reader thread ({reader / disk:.2f}x the disk's "
                 f"cold read), {wall:.2f} GB/s over the map's wall")
    shares = [f"streamed {streamed['compute_seconds'] / streamed['seconds']:.1%} of {streamed['seconds']:.1f} s"]
    if memory is not None:
        shares.append(f"in memory {memory['compute_seconds'] / memory['seconds']:.1%} of {memory['seconds']:.1f} s")
    line("INFO", f"{'GPU' if cuda else 'CPU'} share of wall in layer forwards: {', '.join(shares)}")
    if streamed["device_peak"] is not None:
        ok &= verdict("streamed device peak", streamed["device_peak"] <= budget,
                      f"{streamed['device_peak'] / GIB:.2f} GiB", f"within --max-memory {args.budget_gib} GiB")
    if memory is not None:
        line("INFO", f"wall streamed/in-memory: {streamed['seconds'] / memory['seconds']:.2f}x "
                     f"({streamed['seconds']:.1f} s against {memory['seconds']:.1f} s, opening or load included)")
        pairs = list(zip(streamed["rows"], memory["rows"], strict=True))
        worst = max(abs(s[0] - m[0]) / abs(m[0]) for s, m in pairs)
        same = all(s[1] == m[1] for s, m in pairs)
        ok &= verdict(f"streamed map equals in memory ({dtype})", worst <= BOUND[dtype] and same,
                      f"largest relative perplexity difference {worst:.1e} over {len(pairs)} layers, classes "
                      f"{'identical' if same else 'different'}", f"{BOUND[dtype]:.0e}, classes identical")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0", help="cuda:N, or cpu for the dry run")
    parser.add_argument("--quick", action="store_true", help="a tiny Llama (the dry run)")
    parser.add_argument("--budget-gib", type=float, default=None,
                        help="the streamed map's device budget in GiB (default 3; with --quick 1 on a GPU, "
                        "0.025 on the CPU)")
    parser.add_argument("--dtype", default=None, help="the run's dtype (default bfloat16 on a GPU, float32 on the CPU)")
    parser.add_argument("--work", default=None, help="folder for the model (default: a temporary one)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds one map may take")
    parser.add_argument("--max-memory", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child", nargs=2, metavar=("MODE", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, folder = args.child
        child(mode, folder, args.device, args.dtype, args.max_memory)
        return 0
    with tempfile.TemporaryDirectory(prefix="streamed-gpu-", dir=args.work) as work:
        try:
            return 0 if measure(args, Path(work)) else 1
        except Exception as exc:  # the check's own failure: one FAIL line, never a traceback
            return int(not verdict("streamed map", False, f"stopped: {type(exc).__name__}: {str(exc)[:200]}",
                                   "runs to the end"))


if __name__ == "__main__":
    sys.exit(main())
