"""Issue 43: `./test` is quiet while installing and shows test progress from the start. The install
(scripts/bootstrap.sh) says one line per step with its time, pip's own output (its warnings) kept in
.cache/bootstrap.log and shown only when a step fails; pytest-benchmark's "disabled because xdist"
warning, once per worker before the first test, is filtered (pyproject.toml's pytest section)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STEP = re.compile(r"^anatomy-tui: .+ \.\.\. \d+ s$")  # "anatomy-tui: installing ... 3 s"
NO_VENV = "anatomy-tui: no virtual environment is active"  # said once, where there is none


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without what the pytest running this test set for itself (its worker's name)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTEST_", "COV_"))}
    return {**env, **extra}


def install_copy(tmp_path: Path) -> tuple[Path, Path]:
    """The bootstrap script in a copy of the project's top (no stamp yet), and a python that runs this
    one but answers `-m pip` as a noisy pip does: a line on stdout, a warning on stderr, and the exit
    status in $FAKE_PIP_STATUS."""
    (tmp_path / "scripts").mkdir()
    for name in ("scripts/bootstrap.sh", "scripts/requirements_met.py", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    python = tmp_path / "python"
    python.write_text('#!/usr/bin/env bash\nif [ "${1:-}" = -m ] && [ "${2:-}" = pip ]; then\n'
                      '  echo "Collecting anatomy-tui"; echo "WARNING: pip says something (fake)" >&2\n'
                      '  exit "${FAKE_PIP_STATUS:-0}"\nfi\n'
                      f'exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return tmp_path / "scripts" / "bootstrap.sh", python


def test_the_install_says_one_line_a_step_and_no_pip_warning(tmp_path):
    script, python = install_copy(tmp_path)
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=300,
                          env=clean_env(PYTHON=str(python)))
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    steps = [line for line in lines if not line.startswith(NO_VENV)]
    assert steps and all(STEP.match(line) for line in steps), lines
    assert "WARNING" not in done.stderr and done.stdout == ""
    log = (tmp_path / ".cache" / "bootstrap.log").read_text()
    assert "WARNING: pip says something (fake)" in log and "Collecting anatomy-tui" in log
    assert (tmp_path / ".bootstrap-stamp").is_file()  # the next run installs nothing


def test_a_failed_install_step_shows_pips_words(tmp_path):
    script, python = install_copy(tmp_path)
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=300,
                          env=clean_env(PYTHON=str(python), FAKE_PIP_STATUS="3"))
    assert done.returncode == 3
    assert re.search(r"\.\.\. failed after \d+ s \(exit 3\); the end of \.cache/bootstrap\.log:", done.stderr)
    assert "WARNING: pip says something (fake)" in done.stderr  # shown now: it may say why
    assert not (tmp_path / ".bootstrap-stamp").exists()


def test_an_install_of_another_clone_is_not_taken_for_this_ones(tmp_path):
    """The stamp matches, torch and an `engine` are importable, but that `engine` is another
    checkout's (this test's project, installed editable): the copy installs itself, as a second clone
    of the project must, instead of running the other clone's code."""
    script, python = install_copy(tmp_path)
    env = clean_env(PYTHON=str(python))
    first = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert first.returncode == 0 and (tmp_path / ".bootstrap-stamp").is_file(), first.stderr
    again = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 0 and "anatomy-tui: installing the project" in again.stderr, again.stderr


@pytest.mark.slow
@pytest.mark.parametrize("configured", [True, False])
def test_no_benchmark_warning_before_the_first_test(tmp_path, configured):
    """The project's pytest settings under xdist print no pytest-benchmark warning; without its
    filter (the control) the same run prints it, so the check would see it."""
    pytest.importorskip("pytest_benchmark")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "test_one.py").write_text("def test_one():\n    pass\n")
    override = [] if configured else ["-o", "filterwarnings="]
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider", *override],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env=clean_env())
    assert done.returncode == 0, done.stdout + done.stderr
    warned = "Benchmarks are automatically disabled" in done.stdout + done.stderr
    assert warned is not configured
