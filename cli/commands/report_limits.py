"""The size checks of `anatomy-tui report` (cli/commands/report.py): a result holding more than the
model it names can have (more layers than any model, more rows than its layers, a list longer than
its layers give) is left out of the report with a note, so the time and memory a report takes are
bounded by what it draws."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

MAX_LAYERS = 1024  # no decoder this project loads is deeper (the deepest LMs published have a few hundred)
RECORDS_PER_LAYER = 16  # records in any one list of a result, per layer (a part map: 2, prune's curve: 10 curves)
MAX_POINTS = 1 << 20  # numbers in any one list (a curve of training steps)
MAX_NAME = 4096  # characters of a model's name or path (PATH_MAX)
ATLAS_SERIES = 64  # models of an atlas's figure, and series (model, variant, measure) of its rows per layer


def stated_layers(doc: Mapping[str, Any]) -> int | None:
    """The model's layer count as the result states it: its `n_layers`, else the length of its
    one-layer blocks' angular distances (an ablation map); None when it says neither."""
    stated = doc.get("n_layers")
    if isinstance(stated, int) and not isinstance(stated, bool):
        return stated
    blocks = doc.get("angular_blocks")
    one = blocks.get("1") if isinstance(blocks, dict) else None
    return len(one) if isinstance(one, list) else None


def layer_of(row: Any) -> int | None:
    """The layer a row is of: a record's `layer`, or a layer number itself (manipulate's `layers`)."""
    layer = row.get("layer") if isinstance(row, dict) else row
    return layer if isinstance(layer, int) and not isinstance(layer, bool) else None


def lists(doc: Any) -> Iterator[tuple[str, list[Any]]]:
    """Every list in the document, with where it is (`curve`, `arms.growth.phases`), walked without
    recursion."""
    stack: list[tuple[str, Any]] = [("", doc)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, dict):
            stack.extend((f"{where}.{key}" if where else str(key), item) for key, item in value.items())
        elif isinstance(value, list):
            yield where, value
            stack.extend((f"{where}[]", item) for item in value if isinstance(item, (dict, list)))


def size_problem(name: str, doc: Any) -> str:
    """Why a result holds more than the model it names can have ("" when it does not): more layers
    than any model, more layer rows than its layers (a part map: two per layer), a row of a layer it
    lacks, a list longer than RECORDS_PER_LAYER records per layer or MAX_POINTS numbers (or points of
    a curve over training steps), a model name longer than a path. What the report draws and prints
    is bounded by these."""
    if not isinstance(doc, dict):
        return ""  # the class's decoding says what is wrong with it
    depth = stated_layers(doc)
    if depth is not None and not 0 < depth <= MAX_LAYERS:
        return f"it says the model has {depth} layers (a model here has 1 to {MAX_LAYERS})"
    depth = depth or MAX_LAYERS
    model = doc.get("model")
    if isinstance(model, str) and len(model) > MAX_NAME:
        return f"its model name is {len(model)} characters long (a name or path has at most {MAX_NAME})"
    if name == "atlas":
        return atlas_problem(doc)
    for key, per_layer in (("layers", 1), ("parts", 2)):
        rows = doc.get(key)
        if not isinstance(rows, list):
            continue
        if len(rows) > per_layer * depth:
            return f"{len(rows)} rows in '{key}', more than its model's {depth} layers have"
        wrong = next((layer for row in rows if (layer := layer_of(row)) is not None and not 0 <= layer < depth), None)
        if wrong is not None:
            return f"a row of layer {wrong} in '{key}', which its model of {depth} layers lacks"
    for where, items in lists(doc):
        records = bool(items) and isinstance(items[0], dict)
        steps = records and "step" in items[0]  # a curve of training steps: as long as its budget, not its depth
        limit = RECORDS_PER_LAYER * depth if records and not steps else MAX_POINTS
        if len(items) > limit:
            return (f"{len(items)} {'rows' if records else 'values'} in '{where}', more than a model of {depth} "
                    f"layers gives (at most {limit})")
    return ""


def atlas_problem(doc: Mapping[str, Any]) -> str:
    """An atlas's rows: each of a layer its model has (at most MAX_LAYERS), of at most ATLAS_SERIES
    models, and at most ATLAS_SERIES series of MAX_LAYERS rows each."""
    rows = doc.get("rows")
    if not isinstance(rows, list):
        return ""
    if len(rows) > ATLAS_SERIES * MAX_LAYERS:
        return f"{len(rows)} rows, more than {ATLAS_SERIES} series of {MAX_LAYERS} layers"
    models = {row.get("model") for row in rows if isinstance(row, dict)}
    if len(models) > ATLAS_SERIES:
        return f"{len(models)} models in its rows (an atlas draws at most {ATLAS_SERIES})"
    for row in rows:
        layer, depth = layer_of(row), row.get("n_layers") if isinstance(row, dict) else None
        if isinstance(depth, int) and not 0 < depth <= MAX_LAYERS:
            return f"a row says its model has {depth} layers (a model here has 1 to {MAX_LAYERS})"
        if isinstance(depth, int) and layer is not None and not 0 <= layer < depth:
            return f"a row of layer {layer} of a model of {depth} layers"
    return ""
