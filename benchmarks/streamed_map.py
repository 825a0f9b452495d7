"""The streamed ablation map against the in-memory one (issue 42), on the CPU in float32.

    python3 benchmarks/streamed_map.py [--quick] [--depth 60] [--threads 1] [--rounds 2] [--together]

The embedded model is saved as bfloat16 safetensors, and a deeper one made of its layers repeated
(`--depth`); `--quick` uses a tiny Llama instead. Each map runs in a fresh process (load or open,
then the map, neighbour mean, the paper's 10 texts): wall time, peak resident anonymous memory
(RssAnon sampled every 5 ms, less what the process held before the model), bytes read from the
checkpoint against its file size, and whether the two maps agree (largest relative difference of a
row's perplexity, classes equal). `--rounds` pairs alternate their order (in memory first, then
streamed first) on a shared machine, or with `--together` each pair's maps run at once, sharing its
load (a load that moves between two maps run one after the other moved the 60-layer ratio by 1.5x);
`--threads` torch threads in each map.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def rss_anon() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    return 0


class PeakAnon:
    """The largest RssAnon seen while it runs (a thread polling every 5 ms)."""

    def __init__(self) -> None:
        self.peak = rss_anon()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, rss_anon())

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, rss_anon())


def child(mode: str, folder: str, threads: int) -> None:
    """One map in this process; its figures as one JSON line."""
    import torch  # (imports are not the map's memory or time)
    import transformers  # noqa: F401

    torch.set_num_threads(threads)
    from engine.core.events import Result
    from engine.experiments.ablation.run import run_ablation
    from engine.experiments.ablation.vocabulary import AblationSettings
    from engine.models.loading import load_model
    from engine.models.streaming import open_streamed

    settings = AblationSettings(eval_set="paper", method="mean")
    before = rss_anon()
    meter = PeakAnon()
    start = time.perf_counter()
    if mode == "memory":
        loaded = load_model(folder, device="cpu", dtype="float32")
        stream, bytes_read = None, None
    else:
        loaded = open_streamed(folder, device="cpu", dtype="float32")
        stream = loaded.stream
    events = run_ablation(loaded.model, loaded.tokenizer, settings, stream=stream)
    result = [e for e in events if isinstance(e, Result)][-1].data
    seconds = time.perf_counter() - start
    peak = meter.stop()
    if stream is not None:
        bytes_read = stream.bytes_read
        stream.close()
    print(json.dumps({"seconds": seconds, "peak_anon": peak - before, "bytes_read": bytes_read,
                      "rows": [(row["ppl"], row["layer_class"]) for row in result["layers"]],
                      "baseline": result["baseline_ppl"]}))


def bfloat16_copy(folder: Path, quick: bool) -> Path:
    """The embedded model (or a tiny Llama) written as bfloat16 safetensors with its tokenizer."""
    import torch

    if quick:
        from tiny_models import byte_tokenizer, tiny_model

        model, tokenizer = tiny_model("llama"), byte_tokenizer()
    else:
        from engine.models.loading import load_model

        loaded = load_model("smollm2-135m", device="cpu", dtype="float32")
        model, tokenizer = loaded.model, loaded.tokenizer
    model.to(torch.bfloat16).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def deeper(source: Path, folder: Path, depth: int) -> Path:
    """A model of `depth` layers: layer i is the source's layer i mod its depth."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(source)
    n = config.num_hidden_layers
    state = load_file(source / "model.safetensors")
    out = {key: value for key, value in state.items() if ".layers." not in key}
    for i in range(depth):
        prefix = f"model.layers.{i % n}."
        out.update({f"model.layers.{i}." + key[len(prefix):]: value.clone()
                    for key, value in state.items() if key.startswith(prefix)})
    config.num_hidden_layers = depth
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[i % n] for i in range(depth)]
    folder.mkdir(parents=True)
    config.save_pretrained(folder)
    save_file(out, folder / "model.safetensors", metadata={"format": "pt"})
    AutoTokenizer.from_pretrained(source).save_pretrained(folder)
    return folder


def measure(folder: Path, threads: int, rounds: int, together: bool) -> None:
    size = (folder / "model.safetensors").stat().st_size
    print(f"{folder.name}: file {size / 1e6:.1f} MB")
    ratios = []
    for round_ in range(rounds):
        order = ("memory", "stream") if round_ % 2 == 0 else ("stream", "memory")
        runs = {}
        for batch in [order] if together else [(mode,) for mode in order]:
            started = {mode: subprocess.Popen([sys.executable, __file__, "--child", mode, str(folder), "--threads",
                                               str(threads)], stdout=subprocess.PIPE, text=True) for mode in batch}
            for mode, process in started.items():
                out, _ = process.communicate()
                if process.returncode:
                    raise SystemExit(f"the {mode} map exited {process.returncode}")
                runs[mode] = json.loads(out.strip().splitlines()[-1])
        memory, stream = runs["memory"], runs["stream"]
        worst = max(abs(a[0] - b[0]) / a[0] for a, b in zip(memory["rows"], stream["rows"], strict=True))
        same = all(a[1] == b[1] for a, b in zip(memory["rows"], stream["rows"], strict=True))
        ratios.append(stream["seconds"] / memory["seconds"])
        how = "side by side" if together else "in memory first" if round_ % 2 == 0 else "streamed first"
        print(f"  round {round_ + 1} ({how}), {len(memory['rows'])} layers")
        print(f"    in memory: {memory['seconds']:.1f} s, peak anonymous {memory['peak_anon'] / 2**20:.0f} MiB")
        print(f"    streamed:  {stream['seconds']:.1f} s, peak anonymous {stream['peak_anon'] / 2**20:.0f} MiB, "
              f"read {stream['bytes_read']:,} bytes of {size:,} ({stream['bytes_read'] / size:.4f} of the file)")
        print(f"    wall streamed/in-memory {ratios[-1]:.2f}x; largest relative perplexity difference {worst:.1e}; "
              f"classes identical: {same}")
    print(f"  ratio streamed_map: {sorted(ratios)[len(ratios) // 2]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="a tiny Llama instead of the embedded model")
    parser.add_argument("--depth", type=int, default=60, help="layers of the deeper model (0: none)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in each map")
    parser.add_argument("--rounds", type=int, default=2, help="pairs of maps, their order alternating")
    parser.add_argument("--together", action="store_true",
                        help="start each pair's two maps at once, so they share the machine's load")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, folder = args.child
        child(mode, folder, args.threads)
        return
    with tempfile.TemporaryDirectory() as tmp:
        base = bfloat16_copy(Path(tmp) / ("tiny-bf16" if args.quick else "smollm2-135m-bf16"), args.quick)
        measure(base, args.threads, args.rounds, args.together)
        if args.depth:
            measure(deeper(base, Path(tmp) / f"{base.name}-x{args.depth}", args.depth), args.threads, args.rounds,
                    args.together)


if __name__ == "__main__":
    main()
