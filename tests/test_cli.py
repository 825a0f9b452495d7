"""The command line: `run ablation` into a session with --json, sessions list/show, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tui.cli import main


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
    done = subprocess.run([sys.executable, "-m", "tui.cli", "run", "ablation", "--model", "nope/x/y"],
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
