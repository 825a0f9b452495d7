"""`anatomy-tui report`: a session of several results (built from the registry's samples through the
store) gives the HTML page, the Markdown, one PDF and each result's figure files; the page opens in
headless Chromium with every image loaded; bad input is one line and exit 2; the console's F8
saves the figure of the panel in view and says where."""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import pytest

from cli.main import main
from engine import registry
from engine.core.codec import json_safe
from engine.experiments.ablation.vocabulary import AblationSettings
from sessions.store import SessionStore

pytestmark = pytest.mark.report

NAMES = ("ablation", "recovery", "prune", "weights", "scaling-fit")
CHROMIUM = Path("/usr/bin/chromium")


def report_session(name: str = "demo") -> None:
    """A session holding five results and the job that made the ablation map (its settings, its model)."""
    session = SessionStore().create(name, model="HuggingFaceTB/<b>SmolLM2</b>")  # markup in a name stays text
    for result in NAMES:
        session.save_result(result, json_safe(registry.BY_NAME[result].sample()))
    session.write_job("ablation-1", {
        "id": "ablation-1", "experiment": "ablation", "status": "done", "started": time.time(),
        "settings": AblationSettings(bootstrap=200, method="skip").to_dict(),
        "model": {"model": "HuggingFaceTB/SmolLM2-135M", "dtype": "float32"},
    })  # fmt: skip


def test_report_writes_html_markdown_pdf_and_figures(isolated_home, tmp_path, capsys):
    report_session()
    out = tmp_path / "out"
    assert main(["report", "demo", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"{len(NAMES)} figures" in printed and str(out / "report.html") in printed
    for name in NAMES:
        assert (out / f"{name}.png").stat().st_size > 1000 and (out / f"{name}.svg").exists()
    page = (out / "report.html").read_text()
    assert page.count("src='data:image/png;base64,") == len(NAMES)
    assert "<b>SmolLM2</b>" not in page and "&lt;b&gt;SmolLM2&lt;/b&gt;" in page
    for name in NAMES:
        assert f"<h2 id='{name}'>{name}</h2>" in page
    # the exact command: the recorded job's settings and model, into this session
    assert ("anatomy-tui run ablation --method=skip --bootstrap=200 --model=HuggingFaceTB/SmolLM2-135M "
            "--dtype=float32 --session demo") in page
    assert "anatomy-tui run scaling-fit" in page  # no job: the result's own settings
    assert "version of" in page and "<h3>settings</h3>" in page and "<h3>layers</h3>" in page
    markdown = (out / "report.md").read_text()
    for image in re.findall(r"!\[[^]]*\]\(([^)]+)\)", markdown):
        assert (out / image).exists()
    assert len(re.findall(r"!\[", markdown)) == len(NAMES) and "| layer |" in markdown
    pdf = (out / "report.pdf").read_bytes()
    assert pdf.startswith(b"%PDF") and len(re.findall(rb"/Type\s*/Page\b(?!s)", pdf)) == len(NAMES)


def test_the_command_is_the_jobs_not_the_reporting_machines(isolated_home, tmp_path, monkeypatch):
    """A report written on a machine of 4 GPUs gives the map's command as run anywhere: no --shards
    from the GPUs the report happens to be written beside."""
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    report_session()
    assert main(["report", "demo", "--out", str(tmp_path), "--format", "md"]) == 0
    markdown = (tmp_path / "report.md").read_text()
    assert "anatomy-tui run ablation --method=skip" in markdown and "--shards" not in markdown


def test_one_format_only(isolated_home, tmp_path):
    report_session()
    assert main(["report", "demo", "--out", str(tmp_path), "--format", "md"]) == 0
    assert (tmp_path / "report.md").exists()
    assert not (tmp_path / "report.html").exists() and not (tmp_path / "report.pdf").exists()


def test_pdf_alone_is_one_pdf_of_every_figure(isolated_home, tmp_path, capsys):
    report_session()
    assert main(["report", "demo", "--out", str(tmp_path), "--pdf"]) == 0
    pdf = (tmp_path / "report.pdf").read_bytes()
    assert len(re.findall(rb"/Type\s*/Page\b(?!s)", pdf)) == len(NAMES)
    assert not (tmp_path / "report.html").exists() and not (tmp_path / "report.md").exists()
    assert main(["report", "demo", "--out", str(tmp_path), "--pdf", "--format", "md"]) == 2
    assert "--pdf is short for --format pdf" in capsys.readouterr().err


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists() and shutil.which("chromium") is None, reason="chromium is not installed")
def test_the_page_opens_in_chromium_with_every_image(isolated_home, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    report_session()
    assert main(["report", "demo", "--out", str(tmp_path), "--format", "html"]) == 0
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM if CHROMIUM.exists() else shutil.which("chromium")),
                                    args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page()
            page.goto((tmp_path / "report.html").as_uri())
            widths = page.eval_on_selector_all("img", "images => images.map(i => i.complete ? i.naturalWidth : 0)")
        finally:
            browser.close()
    assert len(widths) == len(NAMES) and all(width > 0 for width in widths)


def read_only(folder: Path, monkeypatch) -> None:
    folder.mkdir()
    folder.chmod(0o555)
    if os.geteuid() == 0:  # root writes anywhere: the check is asked as an unprivileged user would be
        real = os.access
        monkeypatch.setattr("cli.commands.report.os.access",
                            lambda path, mode: False if Path(path) == folder else real(path, mode))


@pytest.mark.parametrize("case, fragment", [
    ("no results", "session 'empty' has no results to report"),
    ("no session", "no session 'absent'"),
    ("a file", "is a file, not a folder"),
    ("read-only", "is not writable"),
    ("format", "--format html,docx: unknown format docx"),
])  # fmt: skip
def test_bad_input_is_one_line(case, fragment, isolated_home, tmp_path, monkeypatch, capsys):
    report_session()
    SessionStore().create("empty", model="tiny")
    argv = {"no results": ["empty"], "no session": ["absent"], "format": ["demo", "--format", "html,docx"],
            "a file": ["demo", "--out", str(tmp_path / "file")], "read-only": ["demo", "--out", str(tmp_path / "ro")]}
    (tmp_path / "file").write_text("x")
    if case == "read-only":
        read_only(tmp_path / "ro", monkeypatch)
    assert main(["report", *argv[case]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("anatomy-tui: error: ") and fragment in err[0], err


def test_a_result_this_version_cannot_read_is_noted_and_left_out(isolated_home, tmp_path):
    report_session()
    session = SessionStore().open("demo")
    session.save_result("manipulate", {"model": "tiny", "results": "not a list"})
    assert main(["report", "demo", "--out", str(tmp_path), "--format", "html"]) == 0
    page = (tmp_path / "report.html").read_text()
    assert "results/manipulate.json left out" in page and not (tmp_path / "manipulate.png").exists()


def test_f8_saves_the_figure_of_the_panel_in_view(isolated_home):
    """The lab's answer to the console's key: the files in the session's figures/ folder, and where."""
    from engine.models.options import ModelOptions
    from tui.lab import Lab

    report_session()
    said: list[tuple[str, str]] = []
    lab = Lab(SessionStore(), ModelOptions("tiny"), tell=lambda text, level: said.append((text, level)))
    lab.open("demo")
    lab.save_figures(("ablation",))
    folder = SessionStore().open("demo").path / "figures"
    assert sorted(p.name for p in folder.iterdir()) == ["ablation.png", "ablation.svg"]
    assert said[-1] == (f"saved ablation.png, ablation.svg in {folder}", "info")
    lab.save_figures(("growth",))  # not in this session
    assert said[-1] == ("no result in this panel to draw yet", "warning")


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_key_in_the_console(isolated_home, anyio_backend):
    from test_tui import until

    from tui.app import AnatomyApp

    report_session()
    app = AnatomyApp(session="demo", load_model=False)
    async with app.run_test(size=(120, 36)) as pilot:
        said = lambda words: any(words in str(n.message) for n in app._notifications)  # noqa: E731
        await pilot.press("f3", "f8")  # the Recovery tab
        await until(pilot, lambda: said("saved"), 60, "the recovery tab's F8 answered")
        await pilot.press("f5", "f8")  # the Prompt tab has no figure: said, nothing written
        await until(pilot, lambda: said("has no figure"), 30, "the Prompt tab's F8 answered")
    folder = SessionStore().open("demo").path / "figures"
    assert sorted(p.name for p in folder.iterdir()) == ["recovery.png", "recovery.svg"]


def test_a_kind_without_a_figure_module_keeps_its_tables(isolated_home, tmp_path):
    """An experiment added since (the throwaway one: its folder, view and row, no figure module) is
    reported with its tables and a note; the other results keep their figures."""
    from throwaway import installed

    report_session()
    for entry in installed(tmp_path / "package", without=("figure",)):
        SessionStore().open("demo").save_result(entry.writes, json_safe(entry.sample()))
        assert main(["report", "demo", "--out", str(tmp_path / "out")]) == 0
        page = (tmp_path / "out" / "report.html").read_text()
        assert f"no figure is drawn for &#x27;{entry.writes}&#x27; results" in page
        assert f"<h2 id='{entry.writes}'>" in page and page.count("data:image/png") == len(NAMES)
        assert not (tmp_path / "out" / f"{entry.writes}.png").exists()


def test_an_atlas_session_reports_its_profiles(isolated_home, tmp_path):
    from test_figures import atlas_sample

    session = SessionStore().create("atlas-demo", model="")
    session.save_result("atlas", atlas_sample().to_json())
    assert main(["report", "atlas-demo", "--out", str(tmp_path), "--format", "html"]) == 0
    page = (tmp_path / "report.html").read_text()
    assert (tmp_path / "atlas.png").exists() and "anatomy-tui compare --atlas demo" in page
    assert not re.findall(r"src='(?!data:)|<script|<link", page)  # self-contained: nothing fetched
