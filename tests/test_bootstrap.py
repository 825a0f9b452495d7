"""scripts/requirements_met.py: bootstrap.sh skips pip's resolver only where nothing is missing."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def met(folder: Path, dependencies: list[str], extras: dict[str, list[str]] | None = None, named: str = "") -> bool:
    """Whether the script finds a project of these requirements met, in an environment that has a
    distribution `fake-dist` 1.0 (one extra, `more`, that needs a package nobody installed)."""
    dist = folder / "site" / "fake_dist-1.0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-dist\nVersion: 1.0\nProvides-Extra: more\n"
                                   "Requires-Dist: no-such-package-xyz; extra == \"more\"\n")
    optional = "".join(f"{name} = {json.dumps(items)}\n" for name, items in (extras or {}).items())
    (folder / "pyproject.toml").write_text(  # JSON's strings and lists are TOML's
        f'[build-system]\nrequires = ["setuptools"]\n\n[project]\nname = "p"\n'
        f"dependencies = {json.dumps(dependencies)}\n\n[project.optional-dependencies]\n{optional}")
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "requirements_met.py"), named], cwd=folder,
                          env={**os.environ, "PYTHONPATH": str(folder / "site")}, capture_output=True, text=True)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode == 0


@pytest.mark.parametrize(("dependencies", "expected"), [
    (["pytest", "fake-dist==1.0"], True),
    (["pytest>=999"], False),  # installed, but too old
    (["no-such-package-xyz"], False),
    (["fake-dist[more]"], False),  # the extra's own requirement is missing
    (["fake-dist>=1; python_version < '3'"], True),  # a marker that excludes it
])
def test_requirements_met_by_what_is_installed(tmp_path, dependencies, expected):
    assert met(tmp_path, dependencies) is expected


def test_only_the_named_extras_count(tmp_path):
    extras = {"cluster": ["no-such-package-xyz"], "test": ["pytest"]}
    assert met(tmp_path, ["pytest"], extras, "test")
    assert not met(tmp_path, ["pytest"], extras, "test,cluster")
