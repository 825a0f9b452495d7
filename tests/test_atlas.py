"""The anatomy atlas (issue 22): relative depth, bins, agreement and stability against hand-worked
values; `anatomy-tui atlas` over three tiny families, killed after the first model and resumed to the
same table; the dataset through `datasets`; `anatomy-tui compare`."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_models import save_tiny

from cli.main import main
from engine.atlas import table as A
from sessions.store import SessionStore

FAMILIES = ("llama", "qwen2", "gemma2")


def row(model: str, layer: int, n: int, measure: str, value: float, variant: str = A.MAIN,
        layer_class: str | None = None) -> A.AtlasRow:
    return A.AtlasRow(model, variant, "s", n, layer, A.relative_depth(layer, n), measure, value, None, None,
                      layer_class, "builtin:paper", None, None, 10, "{}")


def test_relative_depth_and_bins_by_hand():
    assert [A.relative_depth(layer, 4) for layer in range(4)] == [0.0, 1 / 3, 2 / 3, 1.0]
    assert A.relative_depth(0, 1) == 0.0
    assert [A.depth_bin(layer, 4, 10) for layer in range(4)] == [0, 3, 6, 9]  # 0, .33, .67, 1
    assert A.depth_bin(3, 11, 10) == 3  # 3/10 = 0.3 on the boundary: the upper bin, exactly
    assert [A.depth_bin(layer, 5, 4) for layer in range(5)] == [0, 1, 2, 3, 3]  # depth 1 joins the last bin
    assert A.sample_layers(30) == [0, 10, 19, 29]
    assert A.sample_layers(2) == [0, 1]


def test_agreement_by_hand():
    d = [10.0, 50.0, 20.0, 200.0]  # ranks 1 3 2 4
    bi = [0.1, 0.3, 0.2, 0.5]  # same ranks: 1
    ang = [0.4, 0.3, 0.2, 0.1]  # ranks 4 3 2 1: d = -3 0 0 3, 1 - 6*18/(4*15) = -0.8
    ppl = [1.0, 3.0, 2.5, 4.0]  # ranks 1 3 2 4 again
    rows = [row("m", i, 4, name, v[i]) for name, v in
            (("d_pct", d), ("block_influence", bi), ("angular_distance", ang), ("removal_ppl", ppl)) for i in range(4)]
    # a second model: D % ranks 1 2 3 4, BI ranks 2 1 3 4: d = 1 -1 0 0, 1 - 6*2/60 = 0.8
    rows += [row("n", i, 4, "d_pct", [1.0, 2.0, 3.0, 4.0][i]) for i in range(4)]
    rows += [row("n", i, 4, "block_influence", [0.2, 0.1, 0.3, 0.4][i]) for i in range(4)]
    got = A.agreement(rows)
    assert got.pairs["m"]["d_pct~block_influence"] == pytest.approx(1.0)
    assert got.pairs["m"]["d_pct~angular_distance"] == pytest.approx(-0.8)
    assert got.pairs["m"]["block_influence~angular_distance"] == pytest.approx(-0.8)
    assert got.pairs["m"]["d_pct~removal_ppl"] == pytest.approx(1.0)
    assert got.pairs["n"]["d_pct~block_influence"] == pytest.approx(0.8)
    assert got.pairs["n"]["d_pct~angular_distance"] is None  # n has no angular distance
    assert got.with_d["block_influence"] == {"mean": pytest.approx(0.9), "min": pytest.approx(0.8)}
    # both models have L = 4, so bins 0 3 6 9 hold one layer each: the binned profiles are the layers';
    # BI of m ranks 1 3 2 4, of n 2 1 3 4: d = -1 2 -1 0, 1 - 6*6/60 = 0.4
    assert got.across_models["block_influence"] == pytest.approx(0.4)
    assert got.across_models["d_pct"] == pytest.approx(0.8)  # 1 3 2 4 against 1 2 3 4
    assert got.most_consistent == "d_pct"


def test_stability_by_hand():
    main_ = [row("m", i, 5, "d_pct", v) for i, v in enumerate([5.0, 1.0, 3.0, 2.0, 4.0])]
    same = [row("m", i, 5, "d_pct", v, "seed-1") for i, v in enumerate([50.0, 10.0, 30.0, 20.0, 40.0])]
    swapped = [row("m", i, 5, "block_influence", v, v2) for i, (v, v2) in enumerate(
        [(1.0, A.MAIN), (2.0, A.MAIN), (3.0, A.MAIN), (4.0, A.MAIN), (5.0, A.MAIN)])]
    swapped += [row("m", i, 5, "block_influence", v, "seed-1") for i, v in enumerate([2.0, 1.0, 3.0, 5.0, 4.0])]
    got = A.stability(main_ + same + swapped)
    assert got.rho["m"]["d_pct"]["seed-1"] == pytest.approx(1.0)
    assert got.rho["m"]["block_influence"]["seed-1"] == pytest.approx(0.8)  # d = 1 -1 0 1 -1: 1 - 6*4/120
    assert got.stable == {"d_pct": True, "block_influence": True}  # 0.8 is the threshold, included
    assert A.stability(main_).stable == {}  # no variant: nothing to say


def test_shared_bands_by_hand():
    # model a (L = 5): critical, redundant, redundant, minor, critical; model b (L = 3): critical, redundant, critical
    a = [row("a", i, 5, "d_pct", 0.0, layer_class=c)
         for i, c in enumerate(["critical", "redundant", "redundant", "minor", "critical"])]
    b = [row("b", i, 3, "d_pct", 0.0, layer_class=c) for i, c in enumerate(["critical", "redundant", "critical"])]
    bands = A.shared_bands(a + b, 4)
    # bins of a: 0 1 2 3 3; of b: 0 2 3
    assert [band.verdict for band in bands] == ["critical", "uncovered", "redundant", "mixed"]
    assert (bands[2].lo, bands[2].hi) == (0.5, 0.75)
    assert A.class_band({0: "critical", 1: "redundant", 2: "important"}, 3, 5) == "CrrII"


def test_protocol_columns():
    assert A.protocol_of({"settings": {"eval_set": "paper", "eval_file": None, "max_length": 256}}) == {
        "eval_set": "paper", "max_length": 256}
    assert A.protocol_of({"settings": {"eval_set": "full", "eval_file": "x.txt"}}) == {"eval_file": "x.txt"}
    assert A.protocol_of({"protocol": {"dataset": "wikitext", "context": 2048}, "settings": {}}) == {
        "dataset": "wikitext", "context": 2048}
    assert A.eval_text_of({"dataset": "wikitext"}) == "wikitext"
    assert A.eval_text_of({"eval_set": "paper"}) == "builtin:paper"


@pytest.fixture(scope="module")
def families(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {family: save_tiny(root / family, family) for family in FAMILIES}


def atlas_argv(families: dict[str, Path], evaluation: str, name: str = "tiny", *extra: str) -> list[str]:
    return ["atlas", "--models", ",".join(str(families[f]) for f in FAMILIES), "--name", name,
            "--eval-file", evaluation, "--device", "cpu", "--measures", "map,proxies", "--bins", "4", *extra]


def table(home: Path, name: str = "tiny") -> list[dict]:
    doc = SessionStore(home).open(name).load_result("atlas")
    assert doc is not None
    return doc["rows"]


@pytest.mark.slow
def test_atlas_killed_after_the_first_model_resumes_to_the_same_table(families, files, isolated_home, tmp_path,
                                                                       monkeypatch, capsys, one_thread):
    evaluation = files[0]
    import cli.runner
    from sessions.atlas import atlas_tasks

    real = cli.runner.run_command
    calls, seen = [], []

    def killed_on_the_second(*args, **kwargs):
        calls.append(args[0].name)
        if len(calls) == 2:
            raise KeyboardInterrupt  # Ctrl-C while the second model runs
        seen.append(states())  # the console's view as the measure starts, and once its job has ended
        code = real(*args, **kwargs)
        seen.append(states())
        return code

    def states() -> list[tuple[str, str]]:  # each measure's state as the Compare view reads it
        return [(row.state, row.detail) for row in atlas_tasks(SessionStore(), "tiny")]

    monkeypatch.setattr(cli.runner, "run_command", killed_on_the_second)
    assert main(atlas_argv(families, evaluation)) == 130
    err = capsys.readouterr().err
    assert "atlas tiny interrupted at" in err and "qwen2" in err and "failed" not in err
    assert seen == [[("running", "starting"), ("waiting", ""), ("waiting", "")],
                    [("done", ""), ("waiting", ""), ("waiting", "")]]  # the job's end, read in its session
    assert states() == [("done", ""), ("interrupted", ""), ("waiting", "")]
    store = SessionStore(isolated_home)
    state = json.loads((store.open("tiny").path / "checkpoints" / "atlas" / "state.json").read_text())
    assert state["steps"] == {f"{families['llama']}|main|ablation": {"session": "tiny-llama", "status": "run"},
                              f"{families['qwen2']}|main|ablation": {"session": "tiny-qwen2", "status": "interrupted"}}
    assert store.open("tiny").load_result("atlas") is None

    monkeypatch.setattr(cli.runner, "run_command", real)
    assert main(atlas_argv(families, evaluation)) == 0
    err = capsys.readouterr().err
    assert "llama · ablation (map, proxies) on main: reused from session tiny-llama" in err
    assert "qwen2 · ablation (map, proxies) on main: running into session tiny-qwen2" in err
    assert states() == [("done", "")] * 3
    resumed = table(isolated_home)

    fresh_home = tmp_path / "fresh"  # the same atlas, never interrupted, in a store of its own
    monkeypatch.setenv("ANATOMY_TUI_HOME", str(fresh_home))
    assert main(atlas_argv(families, evaluation)) == 0
    assert resumed == table(fresh_home)
    assert {(r["model"], r["measure"]) for r in resumed} == {
        (str(families[f]), m) for f in FAMILIES
        for m in ("d_pct", "block_influence", "angular_distance", "angular_last_token")}
    assert len(resumed) == 3 * 4 * 4  # three models of four layers, four criteria
    first = [r for r in resumed if r["model"] == str(families["gemma2"]) and r["measure"] == "d_pct"]
    assert [r["relative_depth"] for r in first] == [0.0, 1 / 3, 2 / 3, 1.0]
    assert all(r["lo"] is not None and r["lo"] <= r["value"] <= r["hi"] for r in first)  # the bootstrap CI
    assert all(r["eval_text"] == evaluation for r in resumed)

    # run once more: everything reused, nothing loads
    monkeypatch.setattr(cli.runner, "run_command", lambda *a, **k: pytest.fail("nothing should run"))
    assert main(atlas_argv(families, evaluation)) == 0
    # another atlas over a model already measured reuses that session's map
    assert main(atlas_argv({**families}, evaluation, "other")) == 0
    assert "reused from session tiny-llama" in capsys.readouterr().err
    assert [(row.state, row.detail) for row in atlas_tasks(SessionStore(), "other")] == [
        ("reused", f"from session tiny-{family}") for family in FAMILIES]

    # the dataset: parquet and CSV, read back by `datasets`
    from datasets import load_dataset

    folder = fresh_home / "tiny" / "dataset"
    expected = table(fresh_home)
    parquet = load_dataset("parquet", data_files=str(folder / "atlas.parquet"), split="train")
    assert parquet.to_list() == expected
    assert load_dataset(str(folder), split="train").to_list() == expected  # the datasheet's YAML names the parquet
    csv = load_dataset("csv", data_files=str(folder / "atlas.csv"), split="train")
    assert csv["value"] == pytest.approx([r["value"] for r in expected])
    sheet = (folder / "README.md").read_text()
    assert "relative_depth" in sheet and str(families["qwen2"]) in sheet and evaluation in sheet

    # compare --atlas prints the profiles, the bands and the agreement
    assert main(["compare", "--atlas", "tiny", "--bins", "4"]) == 0
    out = capsys.readouterr().out
    assert "D% by relative depth (4 bins of 0.25, log axis)" in out
    assert "criteria agreement" in out and "gemma2" in out and "redundant in every model" in out


def test_atlas_refuses_bad_input_in_one_line(families, files, capsys):
    assert main(["atlas", "--models", "a,b", "--name", "x", "--measures", "map,nope"]) == 2
    assert "--measures map,nope: must be a comma-separated list of map, proxies" in capsys.readouterr().err
    assert main(["atlas", "--models", "a,a", "--name", "x"]) == 2
    assert "a model is named twice" in capsys.readouterr().err
    assert main(["atlas", "--models", "a", "--name", "x", "--measures", "recovery-sample"]) == 2
    assert "needs another measure too" in capsys.readouterr().err
    assert main(["atlas", "--models", "a", "--name", "x", "--calib-file", "/no/such/file"]) == 2
    assert "calibration file /no/such/file does not exist" in capsys.readouterr().err
    assert main(["compare", "only-one"]) == 2
    assert "compare needs two or more sessions" in capsys.readouterr().err


def test_an_atlas_started_with_other_settings_is_refused(families, files, capsys, monkeypatch):
    import cli.runner

    monkeypatch.setattr(cli.runner, "run_command", lambda *a, **k: 130)
    assert main(atlas_argv(families, files[0], "same")) == 130
    assert main(atlas_argv(families, files[0], "same", "--calib-seeds", "1")) == 2
    assert "atlas same was started with other models, measures or texts" in capsys.readouterr().err


@pytest.mark.slow
def test_compare_two_sessions_of_one_model_layer_by_layer(tiny_folder, files, capsys, one_thread):
    evaluation = files[0]
    for session, extra in (("fp", []), ("skip", ["--method", "skip"])):
        assert main(["run", "ablation", "--model", str(tiny_folder), "--device", "cpu", "--eval-file", evaluation,
                     "--session", session, *extra]) == 0
    capsys.readouterr()
    assert main(["compare", "fp", "skip"]) == 0
    out = capsys.readouterr().out
    store = SessionStore()
    d: dict[str, list[float]] = {}
    for name in ("fp", "skip"):
        saved = store.open(name).load_result("ablation")
        assert saved is not None
        d[name] = [r["degradation_pct"] for r in saved["layers"]]
    assert "D% layer by layer:" in out
    lines = out[out.index("D% layer by layer:"):].splitlines()
    assert "tiny (fp)" in lines[1] and "tiny (skip)" in lines[1]  # one model: told apart by session
    for layer in range(4):
        cells = lines[2 + layer].split()
        assert int(cells[0]) == layer
        assert float(cells[1]) == pytest.approx(d["fp"][layer], rel=6e-3, abs=1e-3)
        assert float(cells[2]) == pytest.approx(d["skip"][layer], rel=6e-3, abs=1e-3)
    ranks = {name: sorted(range(4), key=values.__getitem__) for name, values in d.items()}
    position = {name: [order.index(i) for i in range(4)] for name, order in ranks.items()}
    rho = 1 - 6 * sum((a - b) ** 2 for a, b in zip(position["fp"], position["skip"], strict=True)) / (4 * 15)
    said = next(line for line in lines if "Spearman tiny (fp) ~ tiny (skip)" in line)
    assert float(said.split(": ")[1]) == pytest.approx(rho, abs=1e-3)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
@pytest.mark.slow
async def test_console_compare_view_opens_on_k_and_turns_criteria(isolated_home) -> None:
    from tui_fixtures import atlas_session, demo_session

    from tui.app import AnatomyApp
    from tui.screens.compare import CompareScreen

    store = SessionStore()
    demo_session(store, "alone")
    app = AnatomyApp(session="alone", load_model=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        await pilot.press("k")  # no other session with a map: said, nothing opens
        await pilot.pause()
        assert not isinstance(app.screen, CompareScreen)
        assert any("to compare" in str(n.message) for n in app._notifications)
    atlas_session(store)
    app = AnatomyApp(session="atlas", load_model=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        await pilot.press("k")
        await pilot.pause()
        assert isinstance(app.screen, CompareScreen)
        assert app.screen.criteria == ["d_pct", "block_influence", "angular_distance", "removal_ppl"]
        await pilot.press("n", "n")
        assert app.screen.index == 2
        await pilot.press("p", "p", "p")
        assert app.screen.index == 3  # wraps around
        await pilot.press("escape")
        assert not isinstance(app.screen, CompareScreen)


@pytest.mark.slow
def test_calibration_variants_give_each_criterion_its_stability(tiny_folder, tmp_path, isolated_home, capsys,
                                                                one_thread):
    texts = [f"Sentence number {i} is about the {w} that sat on the mat." for i, w in
             enumerate(["dog", "cat", "bird", "fox", "cow", "hen", "pig", "owl"])]
    evaluation, other = tmp_path / "eval.txt", tmp_path / "other text.txt"
    evaluation.write_text("\n".join(texts))
    other.write_text("\n".join(t.upper() for t in texts))
    assert main(["atlas", "--models", str(tiny_folder), "--name", "cal", "--eval-file", str(evaluation),
                 "--calib-seeds", "1", "--calib-file", str(other), "--device", "cpu"]) == 0
    store = SessionStore()
    saved = store.open("cal").load_result("atlas")
    assert saved is not None
    doc = A.AtlasDocument.from_json(saved)
    assert list(doc.variants) == [A.MAIN, "seed-1", "file-other-text"]
    half = (store.open("cal").path / "checkpoints" / "atlas" / "texts" / "seed-1.txt").read_text().splitlines()
    assert len(half) == 4 and set(half) <= set(texts)
    assert doc.variants["file-other-text"]["eval_file"] == str(other)
    assert doc.sessions[str(tiny_folder)]["seed-1"] == {"ablation": "cal-tiny-seed-1"}
    for criterion in ("d_pct", "block_influence", "angular_distance"):
        main_ = A.profile(doc.rows, str(tiny_folder), criterion)
        by_hand = {}  # Spearman worked out here: Pearson of the average ranks, over the layers both have
        for variant in ("seed-1", "file-other-text"):
            other = A.profile(doc.rows, str(tiny_folder), criterion, variant)
            layers = sorted(set(main_) & set(other))
            by_hand[variant] = _spearman_by_hand([main_[k] for k in layers], [other[k] for k in layers])
            got = doc.stability.rho[str(tiny_folder)][criterion][variant]
            assert (got is None) if by_hand[variant] is None else got == pytest.approx(by_hand[variant], abs=1e-9)
        # stable: every variant's rho at least 0.8 (the documented threshold), 0.8 itself included
        expected = all(r is not None and r > 0.8 - 1e-6 for r in by_hand.values())
        assert doc.stability.stable[criterion] is expected, (criterion, by_hand)
    out = capsys.readouterr().out
    assert "calibration sensitivity" in out and "seed-1" in out and "file-other-text" in out


def _spearman_by_hand(a: list[float], b: list[float]) -> float | None:
    """Spearman's rho without the code under test: the Pearson correlation of the two lists' ranks
    (tied values share their average rank); None below 3 points or for a constant list."""

    def ranks(values: list[float]) -> list[float]:
        order = sorted(range(len(values)), key=lambda i: values[i])
        out = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2 + 1
            i = j + 1
        return out

    if len(a) < 3 or len(set(a)) == 1 or len(set(b)) == 1:
        return None
    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    return cov / (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5


def test_spearman_by_hand_matches_worked_examples():
    """The test's own Spearman against rho = 1 - 6 sum d^2 / (n (n^2 - 1)) worked by hand."""
    assert _spearman_by_hand([1, 2, 3, 4, 5], [1, 2, 3, 5, 4]) == pytest.approx(0.9)  # sum d^2 = 2
    assert _spearman_by_hand([1, 2, 3, 4, 5], [2, 1, 3, 5, 4]) == pytest.approx(0.8)  # sum d^2 = 4
    assert _spearman_by_hand([10, 20, 30], [3, 2, 1]) == pytest.approx(-1.0)
    assert _spearman_by_hand([1, 1, 2], [1, 2, 3]) == pytest.approx(0.8660254)  # ranks 1.5 1.5 3: sqrt(3)/2
    assert _spearman_by_hand([1, 1, 1], [1, 2, 3]) is None and _spearman_by_hand([1, 2], [2, 1]) is None


def test_two_atlas_folders_load_as_their_own_tables(tmp_path):
    """`datasets` caches a folder's table by its config: two atlases (or one atlas rerun) each read back
    their own rows, not the first one's from the cache."""
    from datasets import load_dataset

    from engine.atlas.dataset import write_dataset

    docs = []
    for n, values in ((3, [1.0, 200.0, 5.0]), (4, [50.0, 2.0, 3.0, 120.0])):
        rows = [row(f"m{n}", i, n, "d_pct", v) for i, v in enumerate(values)]
        docs.append(A.build("t", [f"m{n}"], ["map"], {}, {A.MAIN: {}}, rows))
    for i, doc in enumerate(docs):
        folder = write_dataset(doc, tmp_path / f"home{i}" / "t" / "dataset")
        loaded = load_dataset(str(folder), split="train", cache_dir=str(tmp_path / "cache"))
        assert loaded.to_list() == [dataclasses.asdict(r) for r in doc.rows]
    write_dataset(docs[0], tmp_path / "home1" / "t" / "dataset")  # the second atlas rerun with other rows
    again = load_dataset(str(tmp_path / "home1" / "t" / "dataset"), split="train", cache_dir=str(tmp_path / "cache"))
    assert again.to_list() == [dataclasses.asdict(r) for r in docs[0].rows]


def test_two_atlases_creating_one_session_at_once_the_second_joins(families, files):
    """The race, made certain: both found no atlas session, the other made it first; this one joins
    (says so) instead of failing with 'already exists'."""
    from cli.commands.atlas import spec_of
    from cli.main import build_parser
    from sessions.atlas import open_atlas

    spec = spec_of(build_parser().parse_args(atlas_argv(families, files[0], "race")))
    first, _ = open_atlas(SessionStore(), "race", spec)

    class Raced(SessionStore):
        looked = False

        def exists(self, name: str) -> bool:  # the first look: the other atlas had not made it yet
            if not self.looked:
                self.looked = True
                return False
            return super().exists(name)

    said: list[str] = []
    second, state = open_atlas(Raced(), "race", spec, said.append)
    assert second.path == first.path and state.steps == {}
    assert said == ["atlas race was just made by another atlas command; this one adds to it"]


ROOT = Path(__file__).resolve().parent.parent
RACER = """
import os, sys, time
from pathlib import Path
from sessions.store import SessionStore

real, barrier = SessionStore.exists, Path(sys.argv[1])

def exists(self, name):  # the atlas's first look for its session: both look before either makes it
    found = real(self, name)
    if name == "at" and not (barrier / str(os.getpid())).exists():
        (barrier / str(os.getpid())).touch()
        while len(list(barrier.iterdir())) < 2:
            time.sleep(0.01)
    return found

SessionStore.exists = exists
from cli.main import main
sys.argv = ["anatomy-tui", *sys.argv[2:]]
sys.exit(main())  # as the command line starts it (engine/core/frozen_imports.py)
"""


@pytest.mark.slow
def test_two_identical_atlases_started_at_once_both_finish(families, files, isolated_home, tmp_path):
    """Two real `anatomy-tui atlas` processes with the same name and models, both looking for the
    atlas session before either has made it: both exit 0 (one makes the atlas session, the other joins
    it, as two `run`s of one session do, and the same for each model's session), with one table."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    argv = atlas_argv(families, files[0], "at")
    argv[argv.index("--models") + 1] = f"{families['llama']},{families['qwen2']}"
    processes = [subprocess.Popen([sys.executable, "-c", RACER, str(barrier), *argv], cwd=ROOT, env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    outcomes = [(p.wait(timeout=600), p.communicate()[1]) for p in processes]
    for code, err in outcomes:
        assert code == 0, err
        assert "already exists" not in err and "Traceback" not in err
    assert sum("this one adds to it" in err for _, err in outcomes) >= 1  # the second joined, and said so
    rows = table(isolated_home, "at")
    assert {(r["model"], r["measure"]) for r in rows} == {
        (str(families[f]), m) for f in ("llama", "qwen2")
        for m in ("d_pct", "block_influence", "angular_distance", "angular_last_token")}
    assert sorted(info.name for info in SessionStore().list()) == ["at", "at-llama", "at-qwen2"]


def test_a_result_written_before_a_setting_existed_is_reused_when_the_default_is_wanted() -> None:
    """A map of 0.3 records no `part` (it mapped whole layers, today's default): the atlas reuses it
    for a whole-layer map, and not for a map of blocks."""
    from engine.experiments.ablation.vocabulary import AblationSettings
    from sessions.atlas import same_settings

    defaults = AblationSettings().to_dict()
    old = {key: value for key, value in defaults.items() if key not in ("part", "proxies_only")}
    assert same_settings(old, defaults, set(), defaults)
    assert not same_settings(old, AblationSettings(part="both").to_dict(), set(), defaults)
    assert not same_settings({**old, "method": "zero"}, defaults, set(), defaults)
