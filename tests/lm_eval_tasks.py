"""Local lm-eval tasks for the tests (the hubs are unreachable here): a multiple-choice YAML that
reads a JSON-lines file through `datasets`' json builder, as a user's local task would.

tests/data/lm_eval/everyday_sense.jsonl: 80 plain English sentence completions with four choices
each (the answer's place shuffled with seed 0), written for these tests and the README's numbers."""

from __future__ import annotations

import json
from pathlib import Path

DATA = Path(__file__).parent / "data" / "lm_eval"
EVERYDAY = DATA / "everyday_sense.jsonl"

TASK = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_target: label
doc_to_choice: "{{{{choices}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
"""


def write_task(folder: Path, name: str = "everyday_sense", data: Path = EVERYDAY) -> Path:
    """`folder`/<name>.yaml, a multiple-choice task on `data` (JSON lines: context, choices, label)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.yaml").write_text(TASK.format(name=name, data=json.dumps(str(data.resolve()))),
                                         encoding="utf-8")
    return folder


def write_items(path: Path, items: list[tuple[str, list[str], int]]) -> Path:
    """A JSON-lines task file of (context, choices, label) items."""
    path.write_text("".join(json.dumps({"context": c, "choices": ch, "label": label}) + "\n"
                            for c, ch, label in items), encoding="utf-8")
    return path
