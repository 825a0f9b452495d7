"""recovery's split sweep joined (`--shards`): a layer's rows from several workers made one, and
one result from the workers' results, every comparison across layers made again over all."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any

from engine.core.codec import json_safe
from engine.core.events import Event, decode_or_none
from engine.experiments.ablation.vocabulary import AblationMap
from engine.experiments.recovery.summary import layer_row, over_layers
from engine.experiments.recovery.vocabulary import RecoveryLayer, RecoveryRepeat, RecoveryResult, RecoverySettings


def whole_layers(events: Iterable[Event], settings: RecoverySettings) -> Iterator[Event]:
    """A split sweep's events with every layer's RecoveryLayer whole: the rows of workers that ran
    some of a layer's repeats are held back and sent on as one row (repeats in order, the row a
    serial sweep makes) once the last of them arrives; whole rows pass at once."""
    parts: dict[int, dict[int, RecoveryRepeat]] = {}
    for event in events:
        if isinstance(event, RecoveryLayer) and len(event.result.repeats) < settings.repeats:
            got = parts.setdefault(event.layer, {})
            got.update({run.repeat: run for run in event.result.repeats})
            if len(got) < settings.repeats:
                continue
            made = [got[r] for r in sorted(got)]
            event = RecoveryLayer(event.layer, layer_row(event.layer, made, settings.settled_steps))
        yield event


def merge_shards(docs: list[dict[str, Any]], settings: RecoverySettings, ablation: dict[str, Any] | None = None
                 ) -> dict[str, Any]:
    """One result from the results of a split sweep (each over some (layer, repeat) runs): rows in
    the order the layers were asked for, and every comparison across layers made again over all;
    `ablation` is the session's ablation map as JSON (as the plan hands it over), read here."""
    shares = [RecoveryResult.from_json(doc) for doc in docs]
    parts = (RecoveryLayer(row.layer, row) for share in shares for row in share.layers)
    rows = {event.layer: event.result for event in whole_layers(parts, settings) if isinstance(event, RecoveryLayer)}
    order = sorted(rows) if settings.layers is None else list(dict.fromkeys(settings.layers))
    resumed = {index for share in shares for index in share.resumed_layers}
    ablation_map = decode_or_none(AblationMap, ablation)
    merged: dict[str, Any] = json_safe(replace(
        shares[0],
        settings=settings,
        **over_layers([rows[index] for index in order], settings, ablation_map),
        resumed_layers=[index for index in order if index in resumed],
        seconds=max(share.seconds for share in shares),
    ))
    return merged
