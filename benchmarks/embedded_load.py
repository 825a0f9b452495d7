"""The embedded model's load once its dequantized copy is cached: the config read from the GGUF's
header, as every load did, against the copy's config.json, as loads do now (issue 31).

    python3 benchmarks/embedded_load.py

Each way reads the config three times in this one process (torch and transformers already imported,
so only the read is timed) and the median CPU time is printed with the ratio; then one whole
`load_model` as shipped. The header holds the 49,152-token vocabulary and its merges, which
transformers' GGUF reader parses whole just to build the config.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def cpu_seconds(work) -> float:
    started = time.process_time()
    work()
    return time.process_time() - started


def main() -> None:
    from transformers import AutoConfig

    from engine.models.gguf_cache import dequantized_copy, gguf_config_source
    from engine.models.loading import load_model
    from engine.models.sources import embedded_gguf

    gguf = embedded_gguf()
    if dequantized_copy(gguf) is None:
        load_model("smollm2-135m", device="cpu", dtype="float32")  # the first load makes the copy
    where, kwargs = gguf_config_source(gguf)
    header = [cpu_seconds(lambda: AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)) for _ in range(3)]
    copy = [cpu_seconds(lambda: AutoConfig.from_pretrained(where, **kwargs)) for _ in range(3)]
    before, after = statistics.median(header), statistics.median(copy)
    print(f"config from the GGUF header: {before:.3f} CPU-s; from the cached copy: {after:.3f} CPU-s "
          f"({before / after:.0f}x)")
    whole = cpu_seconds(lambda: load_model("smollm2-135m", device="cpu", dtype="float32"))
    print(f"a whole cached load_model as shipped (imports done): {whole:.2f} CPU-s")


if __name__ == "__main__":
    main()
