"""The engine and the session store stay free of UI packages, so they run on a headless box."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def modules(package: str) -> list[str]:
    found = [package]
    for info in pkgutil.walk_packages([str(ROOT / package)], prefix=f"{package}."):
        found.append(info.name)
    return found


@pytest.mark.parametrize("package", ["engine", "sessions"])
def test_no_ui_imports(package):
    names = modules(package)
    assert len(names) > 3
    code = (
        "import gc, importlib, sys\n"
        "gc.disable()  # which modules come in is the question, not how the collector likes them\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'rich', 'textual_plotext'))\n"
        "print(','.join(bad))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "", f"UI modules imported by {package}: {done.stdout.strip()}"


@pytest.mark.parametrize("module", ["engine.core.events", "engine.registry", "sessions.store", "tui.state"])
def test_torch_free(module):
    """The vocabulary, the registry, the store and the console's state load without torch or numpy,
    so the console decodes every event before (or without) the engine's heavy imports."""
    code = (
        f"import importlib, sys\nimportlib.import_module({module!r})\n"
        "print(','.join(sorted(m for m in ('torch', 'numpy', 'transformers') if m in sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "", f"{module} imported {done.stdout.strip()}"
