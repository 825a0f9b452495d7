"""What the map's rows say together: the Spearman of the cheap measures against the ablation,
short-transformers' block search, the `--proxies-only` map, and one map from a split sweep's."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from engine.core.codec import json_safe
from engine.evaluation.perplexity import Evaluator
from engine.evaluation.statistics import spearman
from engine.experiments.ablation.vocabulary import (
    AblationMap,
    AblationProxyMap,
    AblationRow,
    AblationSettings,
    ProxyRow,
)
from engine.models.families import PARTS


def proxy_map(model_name: str, evaluator: Evaluator, settings: AblationSettings, seconds: float, baseline: float,
              layer_proxies: tuple[np.ndarray, np.ndarray, dict[int, np.ndarray]],
              block_proxies: dict[tuple[int, str], tuple[float, float, float]]) -> AblationProxyMap:
    """`--proxies-only`: the measures of the one pass, as the full map would record them."""
    influence, angular, blocks = layer_proxies
    layers = [ProxyRow(index, float(influence[index]), float(angular[index]), float(blocks[1][index]))
              for index in range(len(influence))]
    ordered = sorted(block_proxies, key=lambda key: (key[0], PARTS.index(key[1])))
    parts = [ProxyRow(index, *block_proxies[(index, part)], part=part) for index, part in ordered]
    return AblationProxyMap(
        model=model_name, baseline_ppl=baseline, eval_tokens=evaluator.n_tokens, eval_texts=evaluator.n_texts,
        seconds=seconds, settings=settings, layers=layers, protocol=evaluator.protocol,
        angular_blocks={str(k): [float(v) for v in values] for k, values in blocks.items()},
        angular_block_best=block_search(blocks), **({"parts": parts} if settings.parts() else {}),
    )


def spearmans(layers: list[AblationRow]) -> dict[str, float | None]:
    """How well the cheap per-layer measures rank the layers like the ablation does (the angular
    distance over all tokens, `angular_distance`, and of the last token, the field's)."""
    degradations = [row.degradation_pct for row in layers]
    found = {
        "block_influence": spearman([row.block_influence for row in layers], degradations),
        "angular_distance": spearman([row.angular_distance for row in layers], degradations),
    }
    if all(isinstance(row.angular_last_token, float) for row in layers):
        found["angular_last_token"] = spearman([row.angular_last_token for row in layers], degradations)
    return found


def all_spearmans(layers: list[AblationRow], parts: list[AblationRow]) -> dict[str, float | None]:
    """The whole layers' rankings, and with blocks each block kind's, keyed `<part>:<measure>`."""
    found = spearmans(layers)
    for part in PARTS:
        rows = [row for row in parts if row.part == part]
        if rows:
            found.update({f"{part}:{key}": value for key, value in spearmans(rows).items()})
    return found


def block_search(blocks: dict[int, np.ndarray]) -> dict[str, int]:
    """short-transformers' block search: for each block length n, the first layer l of the block
    whose last-token angular distance from layer l's input to layer l+n's is smallest."""
    return {str(n): int(np.argmin(values)) for n, values in blocks.items()}


def merge_shards(docs: list[dict[str, Any]], settings: AblationSettings) -> dict[str, Any]:
    """One map from the maps of a split sweep (each over some layers): rows in layer order and the
    Spearman over all of them, so the numbers equal a serial run's."""
    maps = [AblationMap.from_json(doc) for doc in docs]
    layers = sorted((row for part in maps for row in part.layers), key=lambda row: row.layer)
    blocks = sorted((row for part in maps for row in part.parts or ()),
                    key=lambda row: (row.layer, PARTS.index(row.part)))
    merged = dataclasses.replace(
        maps[0], seconds=max(part.seconds for part in maps), settings=settings, layers=layers,
        spearman=all_spearmans(layers, blocks),
    )
    if settings.parts():
        merged = dataclasses.replace(merged, parts=blocks)
    doc: dict[str, Any] = json_safe(merged)
    return doc
