"""The documentation: the mkdocs site builds with no warning (every page, link and anchor resolves,
every `:::` reference imports), and the README stays a short page whose links all land in the
repository, with the two quick-start commands."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.docs

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


@pytest.mark.slow
def test_the_site_builds_strictly_with_no_warning(tmp_path):
    missing = [name for name in ("mkdocs", "material", "mkdocstrings_handlers.python")
               if importlib.util.find_spec(name.split(".")[0]) is None
               or importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: pip install -e '.[docs]' builds the site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # material's notice about its successor, not ours
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "WARNING" not in output, output
    assert (tmp_path / "site" / "experiments" / "ablation" / "index.html").is_file()
    reference = (tmp_path / "site" / "reference" / "index.html").read_text(encoding="utf-8")
    assert "events_markdown" in reference  # the API reference is made from the docstrings


def _links(text: str) -> list[str]:
    return re.findall(r"\]\(([^)\s]+)\)", text)


def test_the_readme_is_short_and_its_links_land_in_the_repository():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) < 250
    local = [link for link in _links(text) if not re.match(r"[a-z]+://", link)]
    assert len(local) > 10
    for link in local:
        target = (ROOT / link.split("#")[0]).resolve()
        assert target.is_relative_to(ROOT) and target.exists(), f"README links to {link}, not a file of the repository"


def test_no_page_points_outside_the_repository():
    for page in [README, *(ROOT / "docs").rglob("*.md")]:
        text = page.read_text(encoding="utf-8")
        assert "shared/" not in text, f"{page.name} names the project workspace, which no clone has"
        for link in _links(text):
            if not re.match(r"[a-z]+://", link):
                target = (page.parent / link.split("#")[0]).resolve()
                assert target.is_relative_to(ROOT), f"{page.name} links outside the repository: {link}"


def test_the_quick_start_is_two_commands_that_exist():
    text = README.read_text(encoding="utf-8")
    quick = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", quick, flags=re.S)
    commands = [line.split("#")[0].strip() for line in blocks[-1].splitlines() if line.strip()]
    assert commands == ["./start", "./test"]
    for name in commands:
        assert os.access(ROOT / name, os.X_OK), name
    assert "python3 -m venv" in quick  # a virtual environment first
