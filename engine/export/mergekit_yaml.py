"""A prune as mergekit's passthrough merge, so anyone can make the same cut with `mergekit-yaml`.

mergekit (arcee-ai/mergekit) builds a model from `slices`; each slice's source gives a
`layer_range: [start, end]` of a model, 0-based and end-exclusive (mergekit's own whole-model slice
is `[0, num_hidden_layers]`), and `merge_method: passthrough` copies those layers' tensors unchanged,
in order. A cut keeps the runs of consecutive layers between the removed ones: one slice each.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml

from engine.models.pruning import check_removal

MERGEKIT_CONFIG = "mergekit_config.yml"  # the name mergekit gives the config it writes into its own output


def kept_ranges(n_layers: int, removed: Sequence[int]) -> list[tuple[int, int]]:
    """The kept layers of a model of `n_layers` without `removed`, as [start, end) runs."""
    drop = set(check_removal(n_layers, removed))
    ranges: list[tuple[int, int]] = []
    for i in range(n_layers):
        if i in drop:
            continue
        if ranges and ranges[-1][1] == i:
            ranges[-1] = (ranges[-1][0], i + 1)
        else:
            ranges.append((i, i + 1))
    return ranges


def passthrough_config(model: str, n_layers: int, removed: Sequence[int], dtype: str) -> dict[str, Any]:
    """mergekit's configuration of the cut: `model` (a Hub id or a local folder) without `removed`."""
    return {
        "slices": [{"sources": [{"model": model, "layer_range": [start, end]}]}
                   for start, end in kept_ranges(n_layers, removed)],
        "merge_method": "passthrough",
        "dtype": dtype,
    }


def passthrough_yaml(model: str, n_layers: int, removed: Sequence[int], dtype: str) -> str:
    """The configuration as the YAML file `mergekit-yaml CONFIG OUT` reads."""
    removed_text = ", ".join(map(str, sorted(set(removed))))
    recipe: str = yaml.safe_dump(passthrough_config(model, n_layers, removed, dtype), sort_keys=False,
                                 default_flow_style=None)
    return (f"# The same cut with mergekit: mergekit-yaml {MERGEKIT_CONFIG} OUTPUT_FOLDER\n"
            f"# {model} without layers {removed_text} (0-based); layer_range is [start, end), end excluded.\n"
            + recipe)
