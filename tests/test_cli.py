"""The command line: `run ablation` into a session with --json, sessions list/show, one-line errors."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys

import pytest

from cli.main import main


def test_run_ablation_writes_json_and_session(tiny_folder, tmp_path, capsys):
    out = tmp_path / "map.json"
    code = main(["run", "ablation", "--model", str(tiny_folder), "--eval-set", "paper",
                 "--session", "s1", "--json", str(out), "--bootstrap", "50"])
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["method"] == "mean" and len(doc["layers"]) == 4
    capsys.readouterr()
    assert main(["sessions", "list"]) == 0
    listing = capsys.readouterr().out
    assert "s1" in listing and "ablation" in listing


def test_sessions_show_prints_results(tiny_folder, capsys):
    main(["run", "ablation", "--model", str(tiny_folder), "--eval-set", "paper", "--session", "s2"])
    capsys.readouterr()
    assert main(["sessions", "show", "s2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["results"] == ["ablation"]
    assert list(doc["jobs"].values())[0]["status"] == "done"


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["run", "ablation", "--model", "no-such-model"], "unknown model"),
        (["run", "ablation", "--model", "/nope/model.gguf"], "no such GGUF file"),
        (["run", "ablation", "--eval-file", "/nope.txt"], "does not exist"),
        (["run", "ablation", "--bootstrap", "-1"], "--bootstrap"),
        (["run", "ablation", "--session", "../escape"], "bad name"),
        (["sessions", "show", "missing"], "no session"),
        (["export", "s", "out", "--model", "recovered", "--dtype", "half"], "--dtype half: must be one of auto"),
    ],
)
def test_errors_are_one_line(argv, fragment, tiny_folder, capsys):
    if "--model" not in argv and argv[0] == "run":
        argv = [*argv, "--model", str(tiny_folder)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("anatomy-tui: error: ") and fragment in err[0]


def test_error_from_the_real_command_has_no_traceback():
    done = subprocess.run([sys.executable, "-m", "cli.main", "run", "ablation", "--model", "nope/x/y"],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1


def test_an_error_after_the_load_prints_once(tiny_folder, capsys, monkeypatch):
    """The job records the failure; the terminal gets the one error line, not the job's as well."""
    import engine.experiments.ablation.run as ablation
    from engine.core.errors import UserError

    def broken(*args, **kwargs):
        raise UserError("layer 7 went away; rerun")
        yield

    monkeypatch.setattr(ablation, "run_ablation", broken)
    assert main(["run", "ablation", "--model", str(tiny_folder), "--eval-set", "paper"]) == 2
    err = capsys.readouterr().err
    assert err.count("layer 7 went away") == 1 and "anatomy-tui: error: layer 7 went away; rerun" in err


def test_a_map_of_two_layers_names_only_them_and_says_why_spearman_is_undefined(tiny_folder, capsys):
    """Issue 29: `--layers` on two of the tiny model's four layers. The block search's summary names
    only blocks of the layers ablated (not the whole model's best, a layer this run never removed), and
    the rank correlations say why they are undefined."""
    assert main(["run", "ablation", "--model", str(tiny_folder), "--eval-set", "paper", "--layers", "2,3"]) == 0
    out = capsys.readouterr().out
    spearman = next(line for line in out.splitlines() if line.startswith("Spearman vs D"))
    assert spearman == "Spearman vs D: undefined: 2 layers ablated, and a rank correlation needs at least 3"
    blocks = next(line for line in out.splitlines() if line.startswith("angular_block_n"))
    assert "among the layers ablated (2, 3)" in blocks
    named = re.findall(r"layers (\d+)-(\d+)", blocks)
    assert named and {int(layer) for pair in named for layer in pair} <= {2, 3}
    assert "n=2: layers 2-3" in blocks


def test_a_whole_map_says_which_measure_is_undefined_and_why():
    from engine.experiments.ablation.vocabulary import AblationMap
    from engine.registry import BY_NAME
    from tui.views.ablation import _blocks_line, _spearman_line

    sample = BY_NAME["ablation"].sample()
    assert isinstance(sample, AblationMap)
    depth = len(sample.layers)
    rows = [dataclasses.replace(row, degradation_pct=5.0) for row in sample.layers]
    flat = dataclasses.replace(sample, layers=rows, spearman={"block_influence": None})
    assert _spearman_line(flat) == "Spearman vs D: block influence undefined (D % is the same on every layer)"
    # the block search over every layer: the whole map shows its own best, up to blocks shorter than the model
    blocks = {str(n): [0.5 - 0.01 * abs(first - 2) * n for first in range(depth - n + 1)] for n in range(1, depth + 1)}
    best = {n: min(range(len(values)), key=values.__getitem__) for n, values in blocks.items()}
    whole = dataclasses.replace(sample, angular_blocks=blocks, angular_block_best=best)
    line = _blocks_line(whole)
    assert "among" not in line and f"n={depth}:" not in line and f"n=1: layers {best['1']}-{best['1']}" in line
    # two layers apart: only single-layer blocks lie inside what was ablated
    apart = dataclasses.replace(whole, layers=[sample.layers[1], sample.layers[4]])
    line = _blocks_line(apart)
    assert "among the layers ablated (1, 4)" in line and "n=2" not in line
    assert re.findall(r"n=1: layers (\d+)-\1", line) in (["1"], ["4"])
