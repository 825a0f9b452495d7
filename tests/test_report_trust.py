"""`anatomy-tui report` trusts nothing in the session (issue 40): forged text stays text in report.md
as a CommonMark (and GFM) reader renders it; a result with more rows than its model has layers is
left out as damaged, quickly, and the rest is written; the report is written whole or not at all
(a full disk is one line and keeps the previous report; a killed report's leftovers go on the next
run); files get the user's umask; a missing matplotlib is one line naming the extra; a reader that
closes the pipe ends it quietly."""

from __future__ import annotations

import errno
import html
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from cli.main import main
from engine import registry
from engine.core.codec import json_safe
from engine.experiments.ablation.vocabulary import AblationSettings
from sessions.store import SessionStore

pytestmark = pytest.mark.report

ROOT = Path(__file__).resolve().parents[1]
# one line of forged text: live HTML, a fence, a link out, bare URLs and an address GFM links, mathtext
FORGED = ("a````b <script>alert(1)</script> <img src=x onerror=alert(2)> [click](javascript:alert(3)) "
          "![i](https://evil.example/i.png) https://evil.example www.evil.example me@evil.example $\\frac{$ *em* | x")
FORGED_LINES = "x\n```\n<script>alert(4)</script>\n```\n<img src=y onerror=alert(5)>"  # newlines and fences
ALLOWED_TAGS = {"h1", "h2", "h4", "p", "blockquote", "pre", "code", "img", "a", "table", "thead", "tbody", "tr",
                "th", "td"}


def forged_session(name: str = "forged") -> None:
    """An ablation map and a manipulate result whose strings are forged, and the map's job run on a
    forged model name (no control character: a name the store and the flags let in)."""
    session = SessionStore().create(name, model="tiny")
    ablation = json_safe(registry.BY_NAME["ablation"].sample())
    ablation.update(model=FORGED, method=FORGED_LINES)
    session.save_result("ablation", ablation)
    manipulate = json_safe(registry.BY_NAME["manipulate"].sample())
    manipulate.update(prompt=FORGED_LINES, baseline_sample=FORGED)
    session.save_result("manipulate", manipulate)
    session.write_job("ablation-1", {
        "id": "ablation-1", "experiment": "ablation", "status": "done", "started": time.time(),
        "settings": AblationSettings(bootstrap=20).to_dict(), "model": {"model": FORGED},
    })  # fmt: skip


def small_session(name: str = "demo") -> None:
    session = SessionStore().create(name, model="tiny")
    for kind in ("ablation", "recovery"):
        session.save_result(kind, json_safe(registry.BY_NAME[kind].sample()))


def inline_tokens(tokens):
    for token in tokens:
        yield token
        yield from token.children or ()


@pytest.mark.parametrize("preset", ["commonmark", "gfm-like"])
def test_forged_text_stays_text_in_the_markdown(isolated_home, tmp_path, preset):
    forged_session()
    assert main(["report", "forged", "--out", str(tmp_path), "--format", "html,md"]) == 0
    markdown = (tmp_path / "report.md").read_text()
    parser = MarkdownIt(preset)
    tokens = parser.parse(markdown)
    rendered = parser.render(markdown)
    assert not [t for t in inline_tokens(tokens) if t.type in ("html_block", "html_inline")]
    assert set(re.findall(r"</?([a-zA-Z][\w-]*)", rendered)) <= ALLOWED_TAGS
    assert "<script" not in rendered and not re.search(r"<[^>]*onerror", rendered)
    # links and images only to the report's own files beside it
    targets = [t.attrGet("href") or t.attrGet("src") for t in inline_tokens(tokens) if t.type in ("link_open", "image")]
    assert sorted(targets) == ["ablation.png", "ablation.svg", "manipulate.png", "manipulate.svg"]
    assert all((tmp_path / target).is_file() for target in targets)
    # each result's Reproduce block is one code block holding its command, the same as the page shows
    fences = [t.content for t in tokens if t.type in ("fence", "code_block")]
    page = (tmp_path / "report.html").read_text()
    commands = [html.unescape(c) for c in re.findall(r"<p>Reproduce: <code>(.*?)</code></p>", page)]
    assert len(commands) == 2 and fences == [c + "\n" for c in commands]
    assert "a````b" in commands[0] and commands[0].startswith("anatomy-tui run ablation")
    headings = [(t.tag, tokens[i + 1].content) for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert [text for tag, text in headings if tag in ("h1", "h2")] == ["Session forged", "ablation", "manipulate"]
    # the forged text itself is still shown, as text
    assert "alert(1)" in rendered and "&lt;script&gt;" in rendered


def layer_rows(kind: str, n: int) -> dict:
    doc = json_safe(registry.BY_NAME[kind].sample())
    doc["layers"] = [dict(doc["layers"][0], layer=i % 6) for i in range(n)]
    return doc


def test_more_rows_than_layers_is_damaged_and_the_rest_is_written(isolated_home, tmp_path, capsys):
    """100,000 rows of a 6-layer map (its one-layer blocks say 6), 7 rows of a model that says 6,
    a row of layer 6 of 6, a manipulation of layer 5000, and 100,000 rows with no count stated: each
    left out in one line, quickly; the recovery sample is still drawn and reported."""
    session = SessionStore().create("big", model="tiny")
    session.save_result("recovery", json_safe(registry.BY_NAME["recovery"].sample()))
    ablation = layer_rows("ablation", 100_000)
    ablation["angular_blocks"] = {"1": [0.1] * 6}  # one value per layer of the model: 6 layers
    session.save_result("ablation", ablation)
    dynamics = layer_rows("dynamics", 7)
    session.save_result("dynamics", dynamics)
    weights = json_safe(registry.BY_NAME["weights"].sample())
    session.save_result("ablation-proxies", dict(json_safe(registry.BY_NAME["ablation"].sample()), n_layers=6,
                                                layers=[{"layer": 6}]))
    manipulate = json_safe(registry.BY_NAME["manipulate"].sample())
    manipulate["layers"] = [5000]
    session.save_result("manipulate", manipulate)
    session.save_result("weights", dict(weights, n_layers=10**6))
    start = time.monotonic()
    assert main(["report", "big", "--out", str(tmp_path / "out"), "--format", "md"]) == 0
    assert time.monotonic() - start < 60  # before: past 120 s, drawing 100,000 bars
    err = capsys.readouterr().err.splitlines()
    damaged = [line for line in err if "damaged" in line]
    assert len(damaged) == 5, err
    for fragment in ("results/ablation.json left out, damaged: 100000 rows in 'layers', more than its model's 6",
                     "results/dynamics.json left out, damaged: 7 rows in 'layers'",
                     "results/ablation-proxies.json left out, damaged: a row of layer 6 in 'layers'",
                     "results/manipulate.json left out, damaged: a row of layer 5000 in 'layers'",
                     "results/weights.json left out, damaged: it says the model has 1000000 layers"):
        assert any(line.startswith("anatomy-tui report: ") and fragment in line for line in damaged), damaged
    assert "anatomy-tui report: drawing recovery (1 of 1)" in err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["recovery.png", "recovery.svg", "report.md"]
    assert (tmp_path / "out" / "report.md").read_text().count("damaged") == 5


def test_rows_beyond_any_model_without_a_count_are_damaged(isolated_home, tmp_path, capsys):
    session = SessionStore().create("big", model="tiny")
    session.save_result("recovery", layer_rows("recovery", 5000))
    session.save_result("prune", dict(json_safe(registry.BY_NAME["prune"].sample()),
                                      curve=[{"method": "bi", "removed": 1}] * 97))  # 16 a layer of 6: 96
    assert main(["report", "big", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("anatomy-tui: error: session 'big' has no results to report "
                                               "(results/recovery.json left out, damaged: 5000 rows in 'layers', "
                                               "more than its model's 1024 layers have; and 1 more)"), err
    session.save_result("ablation", json_safe(registry.BY_NAME["ablation"].sample()))
    assert main(["report", "big", "--out", str(tmp_path / "out"), "--format", "md"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert "anatomy-tui report: results/prune.json left out, damaged: 97 rows in 'curve', more than a model of 6 " \
           "layers gives (at most 96)" in err, err


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def full_disk_at(monkeypatch, what: str) -> None:
    """The disk fills up at the second figure file, or at report.md."""
    import figures

    if what == "a figure":
        real, calls = figures.write_figure, []

        def write_figure(fig, path, fmt):
            calls.append(path)
            if len(calls) >= 2:
                raise OSError(errno.ENOSPC, "No space left on device", str(path))
            real(fig, path, fmt)

        monkeypatch.setattr(figures, "write_figure", write_figure)
    else:
        real_text = Path.write_text

        def write_text(self, data, *args, **kwargs):
            if self.name == "report.md":
                raise OSError(errno.ENOSPC, "No space left on device", str(self))
            return real_text(self, data, *args, **kwargs)

        monkeypatch.setattr(Path, "write_text", write_text)


@pytest.mark.parametrize("what", ["a figure", "the markdown"])
def test_a_full_disk_is_one_line_and_keeps_the_previous_report(what, isolated_home, tmp_path, monkeypatch, capsys):
    small_session()
    out = tmp_path / "out"
    assert main(["report", "demo", "--out", str(out), "--format", "html,md"]) == 0
    before = snapshot(out)
    SessionStore().open("demo").save_result("dynamics", json_safe(registry.BY_NAME["dynamics"].sample()))
    capsys.readouterr()
    full_disk_at(monkeypatch, what)
    assert main(["report", "demo", "--out", str(out), "--format", "html,md"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("anatomy-tui: error: no space left on ") and f"writing the report to {out}" in err[-1]
    assert err[-1].endswith("; the report there is as it was: free some space and run again"), err
    assert snapshot(out) == before  # the old report, whole, and nothing hidden beside it
    # into a new folder: no partial report, no folder
    assert main(["report", "demo", "--out", str(tmp_path / "new" / "report")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("; nothing was written: free some space and "
                                                                     "run again")
    assert not (tmp_path / "new" / "report").exists()


def test_a_killed_reports_leftovers_go_on_the_next_run(isolated_home, tmp_path):
    small_session()
    out = tmp_path / "out"
    out.mkdir()
    (out / ".report-k1ll3d00").mkdir()
    (out / ".report-k1ll3d00" / "ablation.png").write_bytes(b"half")
    for name in (".report.html.a1b2c3d4.tmp", ".ablation.png.x9y8z7w6.tmp", ".recovery.svg.qwertyui.tmp"):
        (out / name).touch()  # an older version's atomic writes, killed: 0 bytes each
    mine = {"notes.txt": b"keep", ".report.draft.tmp": b"keep too"}  # the user's own files stay
    for name, data in mine.items():
        (out / name).write_bytes(data)
    (out / ".report-templates").mkdir()  # and folders, however they are named
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    killed = subprocess.Popen([sys.executable, "-m", "cli.main", "report", "demo", "--out", str(out)], cwd=ROOT,
                              env=env, stderr=subprocess.PIPE, text=True)
    assert killed.stderr is not None  # stderr=PIPE
    for line in killed.stderr:  # killed as it draws the first figure
        if "drawing" in line:
            killed.send_signal(signal.SIGKILL)
            break
    killed.wait()
    assert killed.returncode == -signal.SIGKILL
    assert main(["report", "demo", "--out", str(out)]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == [".report-templates", ".report.draft.tmp", "ablation.png", "ablation.svg", "notes.txt",
                     "recovery.png", "recovery.svg", "report.html", "report.md", "report.pdf"]
    assert all((out / name).read_bytes() == data for name, data in mine.items())


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_files_have_the_users_permissions(umask, isolated_home, tmp_path):
    small_session()
    old = os.umask(umask)
    try:
        assert main(["report", "demo", "--out", str(tmp_path / "out")]) == 0
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "out").iterdir()}
    assert len(modes) == 7 and set(modes.values()) == {0o666 & ~umask}, modes
    assert (tmp_path / "out").stat().st_mode & 0o777 == 0o777 & ~umask


def cli(args: list[str], **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", *args], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                            stderr=subprocess.PIPE, text=True, **kwargs)


def test_without_matplotlib_it_is_one_line_naming_the_extra(isolated_home, tmp_path):
    small_session()
    script = ("import sys; sys.modules['matplotlib'] = None  # as if not installed\n"
              "from cli.main import main; sys.exit(main(sys.argv[1:]))")
    process = cli([script, "report", "demo", "--out", str(tmp_path / "out")])
    err = process.communicate(timeout=120)[1].strip().splitlines()
    assert process.returncode == 2
    assert err == ["anatomy-tui: error: the report draws its figures with matplotlib, which is not installed: "
                   "pip install 'anatomy-tui[figures]'"]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("both", [False, True], ids=["stdout", "stdout and stderr"])
def test_a_closed_pipe_ends_it_quietly_with_the_report_written(both, isolated_home, tmp_path):
    """`anatomy-tui report demo | head -1` (and `2>&1 | head -1`): the reader gone before the report
    prints anything; the report is still written whole and the command ends as a shell's SIGPIPE
    does (141), with nothing said."""
    small_session()
    read, write = os.pipe()
    os.close(read)  # nothing will read what it prints
    process = subprocess.Popen([sys.executable, "-m", "cli.main", "report", "demo", "--out", str(tmp_path / "out")],
                               cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=write,
                               stderr=write if both else subprocess.PIPE, text=True)
    os.close(write)
    err = process.communicate(timeout=120)[1] or ""
    assert process.returncode == 141, err
    assert "Traceback" not in err and "Error" not in err and "Exception" not in err, err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "ablation.png", "ablation.svg", "recovery.png", "recovery.svg", "report.html", "report.md", "report.pdf"]


def test_a_dollar_in_a_name_is_a_dollar_in_the_figure(isolated_home, tmp_path):
    """A model name that is broken mathtext ($\\frac{$) is drawn as its characters: the SVG keeps text as text."""
    forged_session()
    assert main(["report", "forged", "--out", str(tmp_path), "--format", "md"]) == 0
    assert html.escape("$\\frac{$", quote=False) in (tmp_path / "ablation.svg").read_text()
