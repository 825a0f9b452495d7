"""Issue 43: a mistake on the command line is caught where it is made, in one line naming it: no
abbreviated flags (argparse's prefix matching took `--layer 3` for `--layers 3`), an unknown flag,
command or experiment named with the closest real one, and the console's --model checked before any
screen or session, by the same check `run` makes."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.flags import settings_from_flags
from cli.main import build_parser, main
from engine.core.errors import UserError
from engine.registry import BY_NAME
from sessions.store import SessionStore

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def nothing_starts(monkeypatch):
    """Neither the console nor a run may start: a refusal comes before both."""
    import cli.runner
    from tui.app import AnatomyApp

    monkeypatch.setattr(AnatomyApp, "run", lambda self: pytest.fail("the console started"))
    monkeypatch.setattr(cli.runner, "run_command", lambda *a, **k: pytest.fail("the run started"))


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("anatomy-tui: error: "), err
    return err[0].removeprefix("anatomy-tui: error: ")


@pytest.mark.parametrize(("argv", "expected"), [
    (["--resum"], "unknown flag --resum: did you mean --resume?"),  # opened the console
    (["run", "ablation", "--layer", "3"], "unknown flag --layer: did you mean --layers?"),  # ran a 4-minute map
    (["--sess", "lab"], "unknown flag --sess: did you mean --session?"),
    (["run", "growth", "--step", "3"], "unknown flag --step: did you mean --steps?"),
])
def test_an_abbreviated_flag_is_refused(argv, expected, nothing_starts, capsys):
    assert main(argv) == 2
    assert error_line(capsys) == expected


def parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """A parser and every sub-parser under it."""
    yield parser
    for action in parser._actions:
        if action.nargs == argparse.PARSER and isinstance(action.choices, dict):
            for sub in action.choices.values():
                yield from parsers(sub)


def test_the_parser_itself_takes_no_abbreviation():
    """argparse's own matching is off too, for every parser and sub-parser the command builds."""
    parser = build_parser("ablation")
    every = list(parsers(parser))
    assert len(every) > 10 and not any(each.allow_abbrev for each in every)
    with pytest.raises(UserError):
        parser.parse_args(["--resum"])
    with pytest.raises(UserError):
        parser.parse_args(["run", "ablation", "--layer", "3"])
    assert parser.parse_args(["run", "ablation", "--layers", "3"]).layers == (3,)


@pytest.mark.parametrize(("argv", "expected"), [
    (["--sesion", "lab"], "unknown flag --sesion: did you mean --session?"),  # was "invalid choice: 'lab'"
    (["--sesion=lab"], "unknown flag --sesion: did you mean --session?"),
    (["--sesion", "lab", "--resum"], "unknown flag --sesion: did you mean --session?"),  # the first mistake
    (["run", "ablation", "--sesion", "x"], "unknown flag --sesion: did you mean --session?"),
    (["run", "ablation", "--layers", "3", "--devcie", "cpu"], "unknown flag --devcie: did you mean --device?"),
    (["export", "s", "out", "--modle", "recovered"], "unknown flag --modle: did you mean --model?"),
    (["run", "ablation", "--xyzzy"], "unknown flag --xyzzy (see anatomy-tui run ablation --help)"),
])
def test_a_misspelled_flag_is_named_with_the_closest_real_one(argv, expected, nothing_starts, capsys):
    assert main(argv) == 2
    assert error_line(capsys) == expected


@pytest.mark.parametrize(("argv", "expected"), [
    (["run", "ablaton"], "unknown experiment 'ablaton': did you mean ablation?"),
    (["run", "ablaton", "--layrs", "3"], "unknown experiment 'ablaton': did you mean ablation?"),
    (["run", "recovry", "--layers", "3"], "unknown experiment 'recovry': did you mean recovery?"),
    (["sesions", "list"], "unknown command 'sesions': did you mean sessions?"),
    (["exprot", "s", "out"], "unknown command 'exprot': did you mean export?"),
    (["sessions", "lst"], "unknown sessions command 'lst': did you mean list?"),
    (["run", "zzzz"], "unknown experiment 'zzzz' (see anatomy-tui run --help)"),
])
def test_an_unknown_experiment_or_command_gets_did_you_mean(argv, expected, nothing_starts, capsys):
    assert main(argv) == 2
    assert error_line(capsys) == expected


def test_the_misspelled_flag_is_one_line_from_the_installed_command():
    """As a user types it: the process's own argv, exit 2, one line on stderr, nothing on stdout."""
    done = subprocess.run([sys.executable, "-m", "cli.main", "--sesion", "lab"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.strip() == "anatomy-tui: error: unknown flag --sesion: did you mean --session?"


def test_values_that_look_like_words_are_still_values():
    """The check reads each flag with its value: a value that is a command's name is a value, and a
    negative number after a flag is not taken for a flag."""
    args = build_parser().parse_args(["--session", "run", "--model", "sessions"])
    assert (args.session, args.model, args.command) == ("run", "sessions", None)
    assert build_parser("manipulate").parse_args(["run", "manipulate", "--alphas", "-0.5"]).alphas == (-0.5,)


def test_a_console_form_names_its_misspelled_flag():
    """The growth form's text is read by the same parser class: the closest real flag, no --help hint."""
    with pytest.raises(UserError, match=r"^unknown flag --stpes: did you mean --steps\?$"):
        settings_from_flags(BY_NAME["growth"], ["--stpes", "3"])
    with pytest.raises(UserError, match=r"^unknown flag --qqqq$"):
        settings_from_flags(BY_NAME["growth"], ["--qqqq", "3"])


# the console's --model ------------------------------------------------------------------------------


def listing(folder: Path) -> list[tuple[str, bytes]]:
    return sorted((str(path.relative_to(folder)), path.read_bytes() if path.is_file() else b"")
                  for path in folder.rglob("*"))


def bad_models(tmp_path: Path) -> dict[str, str]:
    """Each model the console must refuse, with the words of the refusal."""
    (tmp_path / "notes.txt").write_text("not a model\n")
    (tmp_path / "fake.gguf").write_text("not a GGUF file either\n")
    (tmp_path / "empty").mkdir()
    return {
        str(tmp_path / "does-not-exist"): "no model at",
        "./does-not-exist": "no model at",
        str(tmp_path / "notes.txt"): "no model at",
        str(tmp_path / "fake.gguf"): "could not load fake.gguf: not a GGUF file",
        str(tmp_path / "empty"): "has no config.json",
        "not-a-hub-name": "unknown model 'not-a-hub-name'",
    }


def test_the_consoles_missing_model_is_refused_before_the_picker(tmp_path, nothing_starts, capsys):
    """`anatomy-tui --model ./does-not-exist` opened the session picker, failed after a session was
    named and left that session naming the missing path: now one line, and the sessions folder is
    as it was (with --session too: no session made)."""
    store = SessionStore()
    store.create("earlier", model="smollm2-135m", settings={})
    before = listing(store.home)
    for model, words in bad_models(tmp_path).items():
        for extra in ([], ["--session", "lab"], ["--resume"]):
            assert main(["--model", model, *extra]) == 2
            assert words in error_line(capsys), (model, extra)
    assert listing(store.home) == before


def test_the_console_and_run_refuse_a_model_with_one_decision(tmp_path, capsys, monkeypatch):
    """The console's refusal is `run`'s, word for word: one check, not two (the run's is made before
    its load, so nothing loads here)."""
    from tui.app import AnatomyApp

    monkeypatch.setattr(AnatomyApp, "run", lambda self: pytest.fail("the console started"))
    for model in bad_models(tmp_path):
        assert main(["--model", model]) == 2
        console = error_line(capsys)
        assert main(["run", "ablation", "--model", model, "--layers", "0"]) == 2
        assert error_line(capsys) == console
    assert listing(SessionStore().home) == []


def test_a_model_the_console_can_load_still_opens_it(tiny_folder, monkeypatch):
    """The check refuses only what cannot load: a real model folder reaches the console."""
    from tui.app import AnatomyApp

    seen = []
    monkeypatch.setattr(AnatomyApp, "run", lambda self: seen.append(self))
    assert main(["--model", str(tiny_folder)]) == 0
    assert len(seen) == 1
