"""The depth family in `anatomy-tui report`: its figure, a table of its members (with each member's
anatomy summary) and of its fit (a_l, its interval, the leave-one-depth-out points, paper B beside
it), every text from the session escaped; a member trained for more steps than a model has layers
times sixteen is still reported (a curve is bounded by points, not by depth)."""

from __future__ import annotations

import html
import re

import pytest

from cli.main import main
from engine.core.codec import json_safe
from engine.experiments.depth_family.vocabulary import sample
from sessions.store import SessionStore

pytestmark = pytest.mark.report

FORGED = "<script>alert(1)</script> [x](javascript:alert(2))"


def tables_of(page: str) -> dict[str, list[list[str]]]:
    """Each <h3> table of the page: its rows of cells, unescaped."""
    found = {}
    for title, body in re.findall(r"<h3>(.*?)</h3><table>(.*?)</table>", page):
        rows = re.findall(r"<tr>(.*?)</tr>", body)
        found[html.unescape(title)] = [[html.unescape(c) for c in re.findall(r"<t[hd]>(.*?)</t[hd]>", row)]
                                       for row in rows]
    return found


def test_the_report_has_the_familys_figure_members_and_fit(isolated_home, tmp_path, capsys):
    doc = json_safe(sample())
    doc["members"][0]["name"] = FORGED
    doc["recipe"]["corpus"] = FORGED
    SessionStore().create("family", model="none").save_result("depth-family", doc)
    out = tmp_path / "out"
    assert main(["report", "family", "--out", str(out), "--format", "html,md"]) == 0
    assert (out / "depth-family.png").stat().st_size > 1000
    page = (out / "report.html").read_text()
    assert "<h2 id='depth-family'>depth-family</h2>" in page and page.count("data:image/png;base64,") == 1
    assert "<script>" not in page and html.escape(FORGED) in page
    tables = tables_of(page)
    header, *members = tables["members"]
    assert len(members) == 8 and header[:3] == ["name", "depth", "width"]
    shares = [row[header.index("anatomy.redundant_share")] for row in members]
    # the sample's member of depth d, seed s: layers 0..d-1 classed critical, important, minor, then redundant
    assert shares == ["0", "0", "0", "0", "0.25", "0.25", "0.625", "0.625"]
    fit = dict(tables["fit"][1:])
    assert fit["alpha_l"] == "1.1" and fit["ci95"] == "0.9, 1.35" and fit["weakly_identified"] == "no"
    assert [row[0] for row in tables["fit.loo"][1:]] == ["1", "2", "4", "8"]
    assert ["paper B (Chinchilla runs)", "1.2", "0.9, 1.5"] in tables["fit.references"]
    assert dict(tables["recipe"][1:])["optimizer"] == "AdamW"
    markdown = (out / "report.md").read_text()
    assert "<script>" not in markdown and "\\[x\\]\\(javascript\\:alert\\(2\\)\\)" in markdown
    assert "#### fit" in markdown and "#### fit.loo" in markdown and " anatomy.redundant\\_share |" in markdown


def test_a_long_training_curve_is_reported_not_damaged(isolated_home, tmp_path, capsys):
    doc = json_safe(sample())
    doc["members"][0]["curve"] = [{"step": s, "train_loss": 3.0, "heldout_loss": None} for s in range(20_000)]
    SessionStore().create("long", model="none").save_result("depth-family", doc)
    assert main(["report", "long", "--out", str(tmp_path / "out"), "--format", "md"]) == 0
    assert "damaged" not in capsys.readouterr().err
    assert (tmp_path / "out" / "depth-family.png").exists()
