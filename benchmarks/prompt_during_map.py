"""A prompt typed while the console's layer map runs: the time to its first generated token, with the
map holding the model for its whole run (the console before turns: the prompt waited for the map)
and with turns (engine/core/turns.py: the map takes the model a batch at a time). The embedded
model on the CPU, the console's own map settings and 64-token generation; the prompt is asked once
the map has ablated its first layer. Also checks the text is the unchanged model's, and times each map.

    python benchmarks/prompt_during_map.py [--layers N]

Last line: `ratio prompt_first_token_during_map old / turns: X`.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPT = "The layers of a transformer"
TOKENS = 64  # the prompt pane's generations (tui/app.py GENERATE_TOKENS)


def during_map(loaded, settings, whole_run: bool) -> tuple[float, float, str]:
    """(seconds to the first token, seconds of the map, the text) for a prompt asked once the map
    has ablated its first layer; `whole_run`: the map holds the model for all of its run."""
    from engine.core.turns import ModelTurns
    from engine.evaluation.generation import generate_text
    from engine.experiments.ablation.run import run_ablation
    from engine.experiments.ablation.vocabulary import LayerAblated

    turns = ModelTurns()
    first_layer = threading.Event()
    map_seconds: list[float] = []

    def mapping() -> None:
        start = time.perf_counter()
        events = run_ablation(loaded.model, loaded.tokenizer, settings, model_name=loaded.name,
                              turns=None if whole_run else turns)
        for event in events:
            if isinstance(event, LayerAblated):
                first_layer.set()
        map_seconds.append(time.perf_counter() - start)

    def held() -> None:
        with turns.turn():
            mapping()

    thread = threading.Thread(target=held if whole_run else mapping)
    thread.start()
    first_layer.wait()
    asked = time.perf_counter()
    first: list[float] = []
    with turns.turn():  # the prompt pane's worker takes one turn a column
        text = generate_text(loaded.model, loaded.tokenizer, PROMPT, TOKENS,
                             on_text=lambda piece: first or first.append(time.perf_counter() - asked))
    thread.join()
    return first[0], map_seconds[0], text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=None, help="map only the first N layers (default: all)")
    args = parser.parse_args()

    import torch

    from engine.evaluation.generation import generate_text
    from engine.experiments.ablation.vocabulary import AblationSettings
    from engine.models.loading import load_model

    loaded = load_model("smollm2-135m", device="cpu", dtype="float32")
    settings = AblationSettings(layers=tuple(range(args.layers)) if args.layers else None)
    expected = generate_text(loaded.model, loaded.tokenizer, PROMPT, TOKENS)
    old_first, old_map, old_text = during_map(loaded, settings, whole_run=True)
    new_first, new_map, new_text = during_map(loaded, settings, whole_run=False)
    layers = args.layers or loaded.n_layers
    print(f"{loaded.name} on the CPU ({torch.get_num_threads()} threads), a map of {layers} layers, "
          f"a {TOKENS}-token prompt asked after the map's first layer")
    print(f"map holding the model (old): first token after {old_first:.2f} s, map {old_map:.1f} s")
    print(f"map taking turns (ours):     first token after {new_first:.2f} s, map {new_map:.1f} s")
    print(f"the text is the unchanged model's: old {old_text == expected}, ours {new_text == expected}")
    print(f"ratio prompt_first_token_during_map old / turns: {old_first / new_first:.1f}")


if __name__ == "__main__":
    main()
