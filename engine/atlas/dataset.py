"""An atlas's merged table as a dataset: parquet and CSV (written by `datasets`) and a datasheet,
a README.md whose YAML header names the parquet file (its one config, named after the contents), so
`datasets.load_dataset(FOLDER)` and `load_dataset("parquet", data_files=FOLDER/atlas.parquet)` read the
same table."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from engine.atlas.table import CRITERIA, AtlasDocument, AtlasRow
from engine.disk.atomic import atomic_write, atomic_write_bytes

PARQUET, CSV, DATASHEET = "atlas.parquet", "atlas.csv", "README.md"

COLUMNS: dict[str, str] = {
    "model": "the model (as given to --models; in `compare`, the session when two share a model)",
    "variant": "the evaluation text: main, or a calibration variant (seed-K: a seeded half of the main texts; "
               "file-NAME: another text)",
    "session": "the session that holds the measurement",
    "n_layers": "L, the model's number of layers",
    "layer": "the layer, from 0",
    "relative_depth": "layer / (L - 1)",
    "measure": "the criterion (below)",
    "value": "its value at this layer",
    "lo": "lower end of the 95 % interval, where there is one (d_pct: paired bootstrap over the texts)",
    "hi": "upper end of that interval",
    "layer_class": "the ablation class of the layer (d_pct rows): critical, important, minor, redundant",
    "eval_text": "the evaluation text (a file, a dataset, or builtin:full / builtin:paper)",
    "context": "tokens per window, where the protocol has windows",
    "stride": "the sliding window's stride, where it has one",
    "eval_tokens": "tokens the measure was evaluated on",
    "protocol": "the whole protocol record, JSON",
}


def config_name(doc: AtlasDocument) -> str:
    """The datasheet's one config, named after the table's contents: `datasets` caches a folder's
    table under its config's name and data-file pattern alone, so a fixed name would hand back an
    earlier table (another atlas's, or this one's before a rerun) from the cache."""
    rows = json.dumps([dataclasses.asdict(row) for row in doc.rows], sort_keys=True)
    return "atlas-" + hashlib.sha256(rows.encode("utf-8")).hexdigest()[:16]


def datasheet(doc: AtlasDocument) -> str:
    protocols = sorted({row.protocol for row in doc.rows})
    lines = [
        "---",
        "configs:",
        f"- config_name: {config_name(doc)}",
        f"  data_files: {PARQUET}",
        "---",
        f"# Anatomy atlas {doc.name}",
        "",
        "Per-layer measures of transformer language models on one protocol, made by "
        "`anatomy-tui atlas`: one row per (model, variant, layer, measure).",
        "",
        "## Models",
        "",
        *[f"- `{model}`: sessions " + ", ".join(sorted({s for v in doc.sessions.get(model, {}).values()
                                                        for s in v.values()})) for model in doc.models],
        "",
        "## Protocol",
        "",
        *[f"- `{p}`" for p in protocols],
        "",
        "Variants: " + ", ".join(f"`{name}` {flags}" for name, flags in doc.variants.items()),
        "",
        "## Columns",
        "",
        *[f"- `{name}`: {text}" for name, text in COLUMNS.items()],
        "",
        "## Measures",
        "",
        *[f"- `{name}`: {text}" for name, text in CRITERIA.items() if name in {r.measure for r in doc.rows}],
        "",
    ]
    return "\n".join(lines)


def write_dataset(doc: AtlasDocument, folder: Path) -> Path:
    """The table in `folder` as parquet, CSV and the datasheet (each file written atomically)."""
    from datasets import Dataset

    folder.mkdir(parents=True, exist_ok=True)
    table = Dataset.from_list([dataclasses.asdict(row) for row in doc.rows] or [_empty()])
    if not doc.rows:
        table = table.select([])
    atomic_write(folder / PARQUET, lambda tmp: table.to_parquet(str(tmp)), "atlas parquet")
    atomic_write(folder / CSV, lambda tmp: table.to_csv(str(tmp), index=False), "atlas CSV")
    atomic_write_bytes(folder / DATASHEET, datasheet(doc).encode("utf-8"), "atlas datasheet")
    return folder


def _empty() -> dict[str, Any]:
    return dataclasses.asdict(AtlasRow("", "", "", 0, 0, 0.0, "", 0.0, 0.0, 0.0, "", "", 0, 0, 0, ""))
