"""`anatomy-tui run` prints its tables whole at any width (issue 43): redirected to a file they were
squeezed into 80 columns and lost digits (`107394…`, `importa…`) while empty interval columns took
the space. Now a column empty in every row is dropped and no value is cut."""

from __future__ import annotations

import dataclasses
import io

import pytest
from rich.table import Table

from cli.printers import print_result
from engine.core.codec import json_safe
from engine.experiments.ablation.vocabulary import AblationMap, sample
from tui.views._tables import WholeConsole


def wide_map() -> AblationMap:
    """A map of huge perplexities and long class labels, without intervals (no --bootstrap)."""
    base = sample()
    rows = [dataclasses.replace(row, ppl=107394.123 + 1000 * row.layer, degradation_pct=5367.5 + row.layer,
                                layer_class="important", anti=False, anti_within_noise=True, ci_low=None,
                                ci_high=None, block_influence=0.123456, angular_distance=0.654321)
            for row in base.layers]
    return dataclasses.replace(base, model="a-model-with-a-long-name/of-some-organisation-1.7B-instruct",
                               layers=rows)


@pytest.mark.parametrize("columns", ["80", "40"])
def test_a_map_redirected_keeps_every_number_whole(columns, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", columns)
    result = wide_map()
    print_result("ablation", json_safe(result))
    out = capsys.readouterr().out
    assert "…" not in out
    for row in result.layers:
        line = next(line for line in out.splitlines() if f"{row.ppl:.2f}" in line)  # each row on one line
        for value in (f"{row.degradation_pct:.1f}", "important anti?", "0.123", "0.654"):
            assert value in line, (value, line)
    assert "95% CI" not in out  # empty in every row: dropped
    assert "D %" in out and "class" in out


def test_a_column_with_a_value_is_kept():
    table = Table()
    for name in ("layer", "95% CI", "empty"):
        table.add_column(name)
    table.add_row("0", "[1.0, 2.0]", "")
    table.add_row("1", "", " ")
    out = io.StringIO()
    WholeConsole(file=out, width=80).print(table)
    assert "95% CI" in out.getvalue() and "empty" not in out.getvalue()


def test_a_narrow_terminal_folds_values_rather_than_cutting_them():
    """On a terminal the table keeps its width and folds a value onto the next lines: every digit stays."""
    table = Table()
    for name in ("layer", "PPL", "class", "parameters removed"):
        table.add_column(name, justify="right")
    table.add_row("0", "107394.12", "important anti?", "1234567890123")
    out = io.StringIO()
    WholeConsole(file=out, width=30, force_terminal=True, color_system=None).print(table)
    text = out.getvalue()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 30
    digits = "".join(ch for ch in text if ch.isdigit())
    assert sorted(digits) == sorted("0" + "10739412" + "1234567890123")
