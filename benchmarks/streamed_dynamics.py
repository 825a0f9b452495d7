"""`run dynamics` streamed against in memory on one model (CPU, float32, one thread): the wall time
of each (in memory: the load and the pass; streamed: the skeleton opened and the pass, which reads
the weights), the bytes the streamed pass read against the checkpoint's, and whether the per-layer
medians agree. One run each in this process; the machine's noise is not averaged away.

    python benchmarks/streamed_dynamics.py [--model smollm2-135m] [--tokens 2048]
"""

from __future__ import annotations

import argparse
import time

import torch

from engine.core.events import Result
from engine.experiments.dynamics.run import run_dynamics
from engine.experiments.dynamics.vocabulary import DynamicsSettings
from engine.models.loading import load_model
from engine.models.streaming import open_streamed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, default=2048)
    args = parser.parse_args()
    torch.set_num_threads(1)
    settings = DynamicsSettings(max_tokens=args.tokens, clusters=3)
    began = time.perf_counter()
    loaded = load_model(args.model, device="cpu", dtype="float32")
    load = time.perf_counter() - began
    began = time.perf_counter()
    memory = [e for e in run_dynamics(loaded.model, loaded.tokenizer, settings) if isinstance(e, Result)][-1].data
    run = time.perf_counter() - began
    del loaded
    began = time.perf_counter()
    streamed = open_streamed(args.model, device="cpu", dtype="float32")
    source = streamed.stream
    assert source is not None
    found = [e for e in run_dynamics(streamed.model, streamed.tokenizer, settings, stream=source)
             if isinstance(e, Result)][-1].data
    passed = time.perf_counter() - began
    agree = all(abs(a["angle_state"]["median"] - b["angle_state"]["median"]) <= 1e-5 * abs(a["angle_state"]["median"])
                for a, b in zip(memory["layers"], found["layers"], strict=True))
    print(f"{memory['tokens']} tokens, {len(memory['layers'])} layers: in memory {load:.1f} s load + {run:.1f} s; "
          f"streamed {passed:.1f} s; read {source.bytes_read:,} of {source.checkpoint_bytes():,} bytes, "
          f"{max(source.reads.values())} read a tensor at most, {source.peak_layers} layer held; "
          f"medians agree: {agree}")
    source.close()


if __name__ == "__main__":
    main()
