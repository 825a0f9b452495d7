"""A process started for one headless job imports torch, transformers and the computation with the
garbage collector off and then freezes them (engine/core/frozen_imports.py); any other caller of the
same code (the console, a notebook, a test calling `main([...])`) imports as usual."""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from types import ModuleType

import pytest

import engine.core.frozen_imports as frozen_imports
from cli.main import main


@pytest.fixture
def freezes(monkeypatch) -> list[bool]:
    """Each gc.freeze() call, recorded (as whether the collector was off then), not made: this test
    process must not freeze what it holds."""
    calls: list[bool] = []
    monkeypatch.setattr(gc, "freeze", lambda: calls.append(gc.isenabled()))
    monkeypatch.setattr(frozen_imports, "_one_job", False)
    monkeypatch.setattr(frozen_imports, "_frozen", False)
    return calls


@pytest.fixture
def probe_module(tmp_path, monkeypatch) -> str:
    """A module that records, as it is imported, whether the collector was on."""
    (tmp_path / "collector_probe.py").write_text("import gc\nENABLED = gc.isenabled()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "collector_probe", raising=False)
    return "collector_probe"


def test_outside_a_one_job_process_modules_import_as_usual(freezes, probe_module):
    frozen_imports.import_frozen(probe_module)
    assert sys.modules[probe_module].ENABLED and gc.isenabled() and freezes == []


def test_in_a_one_job_process_they_import_with_the_collector_off_then_freeze(freezes, probe_module):
    frozen_imports.one_job_process()
    frozen_imports.import_frozen(probe_module)
    assert sys.modules[probe_module].ENABLED is False  # off while it imported
    assert freezes == [False] and gc.isenabled()  # frozen, then the collector back on


def test_only_the_first_import_freezes(freezes, probe_module):
    """An atlas runs its measures one after another in its process: what an earlier measure left
    (a model in a garbage cycle) is never frozen by a later one's imports."""
    frozen_imports.one_job_process()
    frozen_imports.import_frozen("json")
    frozen_imports.import_frozen(probe_module)
    assert freezes == [False] and sys.modules[probe_module].ENABLED is True


def test_a_collector_the_caller_turned_off_stays_off(freezes, probe_module):
    frozen_imports.one_job_process()
    gc.disable()
    try:
        frozen_imports.import_frozen(probe_module)
        assert not gc.isenabled() and freezes == [False]
    finally:
        gc.enable()


@pytest.mark.parametrize(("argv", "one_job"), [
    (["run", "ablation", "--eval-file", "/no/such/texts.txt"], True),  # refused, but the process is a run's
    (["atlas", "--models", "a", "--name", "x", "--measures", "nope"], True),
    (["sessions", "--list"], False),  # no job
])
def test_the_command_line_marks_its_process_and_main_called_from_python_does_not(freezes, monkeypatch, argv,
                                                                                  one_job):
    main(argv)
    assert frozen_imports._one_job is False
    monkeypatch.setattr(sys, "argv", ["anatomy-tui", *argv])
    main()
    assert frozen_imports._one_job is one_job


def test_a_run_imports_its_computation_and_transformers_model_code_frozen(tiny_folder, files, monkeypatch):
    calls: list[tuple[str | Callable[[], ModuleType], ...]] = []  # a name, or an experiment's computation
    monkeypatch.setattr(frozen_imports, "import_frozen", lambda *modules: calls.append(modules))
    assert main(["run", "ablation", "--model", str(tiny_folder), "--eval-file", files[0], "--layers", "1"]) == 0
    assert main(["run", "toy-depth", "--preset", "tiny", "--steps", "2", "--student-depths", "2", "--seeds", "1",
                 "--bootstrap", "0"]) == 0
    named = [tuple(module if isinstance(module, str) else module().__name__ for module in call) for call in calls]
    assert named == [("engine.experiments.ablation.run", "transformers.modeling_utils"),
                     ("engine.experiments.toy_depth.run",)]  # a run without a model needs no transformers
