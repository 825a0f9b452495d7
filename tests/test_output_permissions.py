"""Files anatomy-tui writes atomically (--json, results, exports' cards, figures) get the permissions a
plain `open()` would give them: 0666 less the umask for a new file, an existing file's own mode when
it is replaced; never mkstemp's private 0600 (issue 43)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.disk.atomic import atomic_write_json


@pytest.fixture
def umask() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_new_file_gets_0644_under_umask_022(tmp_path, umask):
    path = tmp_path / "result.json"
    atomic_write_json(path, {"v": 1})
    assert mode(path) == 0o644


def test_a_tighter_umask_is_kept(tmp_path):
    old = os.umask(0o077)
    try:
        atomic_write_json(tmp_path / "private.json", {"v": 1})
    finally:
        os.umask(old)
    assert mode(tmp_path / "private.json") == 0o600


def test_a_replaced_file_keeps_its_own_mode(tmp_path, umask):
    path = tmp_path / "shared.json"
    path.write_text("{}")
    os.chmod(path, 0o640)
    atomic_write_json(path, {"v": 2})
    assert mode(path) == 0o640 and path.read_text().startswith("{\n")


@pytest.mark.report
def test_a_saved_figure_gets_0644_under_umask_022(tmp_path, umask):
    pytest.importorskip("matplotlib")
    from engine.experiments.ablation.vocabulary import sample
    from figures import save_figure

    written = save_figure(sample(), tmp_path / "ablation", ("png", "svg"))
    assert [mode(path) for path in written] == [0o644, 0o644]
