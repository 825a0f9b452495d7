"""Issue 29: a stopped layer map keeps what it finished. A cancel, Ctrl-C or SIGTERM leaves
results/ablation.json with the finished rows, marked `partial` (each row equal to a full run's), the
command line and the console's Layers panel say `partial: k of n layers`, and a resume (`--resume`,
or `a` again in the console) completes it to the map an uninterrupted run makes."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from collections.abc import Generator
from typing import cast

import pytest
from test_signals import check_interrupted, check_resumed, resume_line, start, wait_for

from cli.main import main
from engine.core.codec import ABSENT, json_safe
from engine.core.events import Cancelled, CancelToken, Message, Result
from engine.experiments.ablation.run import run, run_ablation
from engine.experiments.ablation.vocabulary import AblationMap, AblationSettings, LayerAblated, sample
from engine.experiments.context import RunContext
from engine.models.loading import LoadedModel
from sessions.job_runner import run_job
from sessions.store import SessionStore
from tui.screens.console import map_job_line
from tui.state import JobView

pytestmark = pytest.mark.usefixtures("one_thread")

EVAL = [f"Text {i}: the dog sat on the mat number {i} and the cat looked on." for i in range(6)]


@pytest.fixture
def eval_file(tmp_path) -> str:
    path = tmp_path / "eval.txt"
    path.write_text("\n".join(EVAL), encoding="utf-8")
    return str(path)


def settings_for(eval_file: str, **changes) -> AblationSettings:
    return AblationSettings(eval_file=eval_file, eval_batch_size=2, bootstrap=20, **changes)


def loaded_tiny(tiny_llama) -> LoadedModel:
    model, tokenizer = tiny_llama
    return LoadedModel(model, tokenizer, "tiny", "test", "cpu", "float32", "llama", 4)


def stopping_after(events, token: CancelToken, rows: int):
    """The run's events, cancelled as soon as `rows` rows are finished; every event it yields."""
    seen = []
    with pytest.raises(Cancelled):
        for event in events:
            seen.append(event)
            if isinstance(event, LayerAblated) and sum(isinstance(e, LayerAblated) for e in seen) == rows:
                token.cancel()
    return seen


def result_of(events) -> AblationMap:
    (found,) = [event for event in events if isinstance(event, Result)]
    return AblationMap.from_json(found.data)


def same_rows(a: AblationMap, b: AblationMap) -> None:
    """Every number of the rows equal, bit for bit (the bootstrap's interval too)."""
    assert a.layers == b.layers and (a.parts or []) == (b.parts or [])


@pytest.mark.parametrize("part", ["layer", "both"])
def test_a_cancelled_map_keeps_exactly_its_finished_rows_each_equal_to_a_full_runs(tiny_llama, eval_file, part):
    model, tokenizer = tiny_llama
    settings = settings_for(eval_file, part=part)
    full = result_of(list(run_ablation(model, tokenizer, settings, model_name="tiny")))
    assert full.partial is ABSENT and "partial" not in json_safe(full)  # a whole map reads and writes as before
    token = CancelToken()
    rows = 2 if part == "layer" else 4  # with blocks: layer 0, its attention and MLP, then layer 1
    events = stopping_after(run_ablation(model, tokenizer, settings, token, "tiny"), token, rows)
    partial = result_of(events)
    assert isinstance(events[-1], Result)  # handed over last, before the cancel went on
    assert partial.partial is True and partial.partial_text() == "partial: 2 of 4 layers"
    assert [row.layer for row in partial.layers] == [0, 1]
    assert partial.layers == full.layers[:2]
    if part == "both":
        assert partial.parts == full.parts[:2]  # layer 0's attention and MLP; layer 1's not yet
    assert partial.baseline_ppl == full.baseline_ppl and partial.angular_blocks == full.angular_blocks


def test_a_map_cancelled_before_its_first_layer_writes_no_map(tiny_llama, eval_file):
    """Nothing finished: no partial map (an earlier whole map of the session is not replaced by nothing)."""
    model, tokenizer = tiny_llama
    token = CancelToken()
    events = []
    with pytest.raises(Cancelled):
        for event in run_ablation(model, tokenizer, settings_for(eval_file), token, "tiny"):
            events.append(event)
            if event.kind == "ablation.proxies":
                token.cancel()
    assert not any(isinstance(event, Result) for event in events)


def test_a_resume_completes_the_partial_map_to_the_full_one(tiny_llama, eval_file, tmp_path):
    loaded = loaded_tiny(tiny_llama)
    settings = settings_for(eval_file)
    full = result_of(list(run(settings, _context(loaded, tmp_path / "full"))))
    token = CancelToken()
    folder = tmp_path / "stopped"
    stopping_after(run(settings, _context(loaded, folder, token)), token, 3)
    checkpoint = json.loads((folder / "layers.json").read_text())
    assert sorted(checkpoint["layers"]) == ["0", "1", "2"] and checkpoint["key"]["model"] == "tiny"
    events = list(run(settings, _context(loaded, folder, resume=True)))
    resumed = result_of(events)
    assert [event.layer for event in events if isinstance(event, LayerAblated)] == [3]  # only the one left
    assert any(isinstance(e, Message) and e.text.startswith("resuming: 3 of 4 layers already finished") for e in events)
    assert resumed.partial is ABSENT
    same_rows(resumed, full)
    assert resumed.spearman == full.spearman and resumed.angular_block_best == full.angular_block_best


def test_a_fresh_run_forgets_an_older_checkpoint_and_a_damaged_one_says_what_to_do(tiny_llama, eval_file, tmp_path):
    from engine.core.errors import UserError

    loaded = loaded_tiny(tiny_llama)
    settings = settings_for(eval_file, layers=(1, 2))
    token = CancelToken()
    stopping_after(run(settings, _context(loaded, tmp_path, token)), token, 1)
    assert list(json.loads((tmp_path / "layers.json").read_text())["layers"]) == ["1"]
    events = run(settings, _context(loaded, tmp_path))
    assert isinstance(events, Generator)  # run is a generator function
    next(events)  # the first step writes the new run's (empty) checkpoint
    assert json.loads((tmp_path / "layers.json").read_text())["layers"] == {}
    events.close()
    (tmp_path / "layers.json").write_text(json.dumps({"key": json.loads((tmp_path / "layers.json").read_text())["key"],
                                                      "layers": {"1": {"layer": "one"}}}))
    with pytest.raises(UserError, match="damaged .*run without --resume to start over"):
        list(run(settings, _context(loaded, tmp_path, resume=True)))
    with pytest.raises(UserError, match="resume with the same settings or run without --resume"):
        list(run(settings_for(eval_file, layers=(1, 3)), _context(loaded, tmp_path, resume=True)))


def _context(loaded, folder, token=None, resume=False):
    folder.mkdir(parents=True, exist_ok=True)
    return RunContext(model=loaded, cancel=token or CancelToken(), checkpoint_dir=folder, resume=resume)


def test_a_stop_between_two_events_still_keeps_the_partial_map(tiny_llama, eval_file, tmp_path):
    """Ctrl-C while an event is written (outside the run): the job passes it into the run, which
    hands over its rows; the job ends cancelled, the partial map saved."""
    model, tokenizer = tiny_llama
    session = SessionStore(tmp_path).create("p")
    rows = []

    def on_event(event):
        if isinstance(event, LayerAblated):
            rows.append(event.layer)
            if len(rows) == 2:
                raise KeyboardInterrupt

    events = run_ablation(model, tokenizer, settings_for(eval_file), None, "tiny")
    assert run_job(session, "ablation", {}, events, on_event=on_event) is None
    saved = AblationMap.from_json(session.results()["ablation"])
    assert saved.partial is True and [row.layer for row in saved.layers] == [0, 1]
    assert next(iter(session.jobs().values()))["status"] == "cancelled"


def test_the_layer_panel_says_partial_and_how_to_complete_it():
    whole = sample()
    assert map_job_line([], whole) == ""
    partial = dataclasses.replace(whole, layers=whole.layers[:2], partial=True,
                                  angular_blocks={"1": [0.1] * 6})  # fmt: skip
    assert map_job_line([], partial) == "partial: 2 of 6 layers · a completes it"
    running = JobView("j", "ablation", status="running", done=3, total=6)
    assert map_job_line([(running, "in the console")], partial).startswith("map in the console: 3/6")
    assert AblationMap.from_json(json.loads(json.dumps(json_safe(partial)))).partial is True  # round-trips
    old = json.loads(json.dumps(json_safe(whole)))
    assert "partial" not in old and AblationMap.from_json(old).partial is ABSENT  # a whole map as before


def test_a_partial_map_is_no_input_for_the_experiments_that_read_one():
    """Prune's `--method map`, growth's profile and manipulation's default layers would rank the
    finished layers alone: a partial map reads as no map, as it does for the atlas's reuse."""
    whole = sample()
    partial = dataclasses.replace(whole, layers=whole.layers[:2], partial=True)
    assert RunContext(inputs={"ablation": json_safe(whole)}).input(AblationMap) == whole
    assert RunContext(inputs={"ablation": json_safe(partial)}).input(AblationMap) is None


def stopped_mid_map(flags: list[str], tries: int = 5) -> tuple[str, str, str]:
    """A run of the 4-layer map given SIGTERM after its first layer and before its last: held
    (SIGSTOP) at its first layer's event, it is signalled only if its log has fewer than 4 layers
    then; on a loaded machine it may have finished first, and runs again in a new session. The
    session, stdout and stderr."""
    home = SessionStore().home
    for attempt in range(tries):
        session = f"cut{attempt}"
        process = start([*flags, "--session", session])
        wait_for(process, session, "ablation.layer")
        os.kill(process.pid, signal.SIGSTOP)
        mid_map = (home / session / "events.jsonl").read_text().count('"kind": "ablation.layer"') < 4
        if mid_map:
            process.send_signal(signal.SIGTERM)
        os.kill(process.pid, signal.SIGCONT)
        out, err = process.communicate(timeout=600)
        if mid_map:
            assert process.returncode == 143, err
            return session, out, err
    raise AssertionError(f"the map finished before the signal on each of {tries} tries")


@pytest.mark.slow
def test_sigterm_keeps_the_partial_map_prints_it_and_the_offered_resume_completes_it(tiny_folder, eval_file, tmp_path):
    flags = ["run", "ablation", "--model", str(tiny_folder), "--device", "cpu", "--eval-file", eval_file,
             "--eval-batch-size", "1", "--bootstrap", "20"]
    full = tmp_path / "full.json"
    assert main([*flags, "--json", str(full)]) == 0
    session, out, err = stopped_mid_map(flags)
    old = check_interrupted(session, "SIGTERM")
    saved = AblationMap.from_json(SessionStore().open(session).results()["ablation"])
    finished = len(saved.layers)
    assert saved.partial is True and 1 <= finished < 4
    assert f"partial: {finished} of 4 layers (the run stopped before its last layer" in out  # the printed map
    assert saved.layers == AblationMap.from_json(json.loads(full.read_text())).layers[:finished]
    out = tmp_path / "resumed.json"
    assert main([*resume_line(err, "ablation", "SIGTERM"), "--json", str(out)]) == 0
    check_resumed(session, old)
    resumed, whole = (AblationMap.from_json(json.loads(path.read_text())) for path in (out, full))
    assert resumed.partial is ABSENT and resumed.layers == whole.layers and resumed.spearman == whole.spearman


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_console_keeps_a_cancelled_map_as_partial_and_a_completes_it(isolated_home, tiny_folder, monkeypatch,
                                                                                anyio_backend):
    """The console's map cancelled after two layers: the Layers panel says `partial: 2 of 4 layers`,
    the session keeps those rows; `a` again measures only the two left and the map is whole."""
    from test_tui import SIZE, loaded, tiny_app, until

    import engine.experiments.ablation.run as ablation_run

    real = ablation_run.run_ablation
    runs: list[list[int]] = []

    def cancelled_after_two(model, tokenizer, settings, cancel=None, *args, **kwargs):
        runs.append([])
        for event in real(model, tokenizer, settings, cancel, *args, **kwargs):
            yield event
            if isinstance(event, LayerAblated):
                runs[-1].append(event.layer)
                if len(runs) == 1 and len(runs[0]) == 2:
                    cancel.cancel()  # what c does

    monkeypatch.setattr(ablation_run, "run_ablation", cancelled_after_two)
    app = tiny_app(tiny_folder)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("a")
        await until(pilot, lambda: len(app.state.jobs) == 1 and not app.state.running_jobs()
                    and "ablation" not in app.lab.cancels)
        subtitle = lambda: app.screen.query_one("#layers").border_subtitle  # noqa: E731
        await until(pilot, lambda: (subtitle() or "").startswith("partial"), 30, "the Layers panel drawn as partial")
        assert [job.status for job in app.state.jobs.values()] == ["cancelled"]
        assert subtitle() == "partial: 2 of 4 layers · a completes it"
        kept = AblationMap.from_json(SessionStore().open("s").results()["ablation"])
        assert kept.partial is True and [row.layer for row in kept.layers] == [0, 1]
        await pilot.press("a")
        await until(pilot, lambda: len(app.state.jobs) == 2 and not app.state.running_jobs()
                    and "ablation" not in app.lab.cancels)
        await until(pilot, lambda: subtitle() == "", 30, "the Layers panel drawn whole (no subtitle)")
        assert runs[1] == [2, 3]  # only the layers left
        whole = AblationMap.from_json(SessionStore().open("s").results()["ablation"])
        assert whole.partial is ABSENT and [row.layer for row in whole.layers] == [0, 1, 2, 3]
        assert whole.layers[:2] == kept.layers
        statuses = sorted(doc["status"] for doc in SessionStore().open("s").jobs().values())
        assert statuses == ["done", "resumed"]  # the cancelled map was continued


def test_a_stopped_recovery_sweep_keeps_its_finished_layers_as_partial(tiny_llama, eval_file, tmp_path):
    """Recovery too: stopped during its second layer, the result holds the first layer (its curve as
    a full sweep has it) marked `partial: 1 of 2 layers`; a resume from the checkpoint completes it."""
    from engine.experiments.recovery.run import run as run_recovery_entry
    from engine.experiments.recovery.run import run_recovery
    from engine.experiments.recovery.vocabulary import RecoveryLayer, RecoveryResult, RecoverySettings

    model, tokenizer = tiny_llama
    train = tmp_path / "train.txt"
    train.write_text("\n".join(f"The cat number {i} sat on the mat and looked at the dog." for i in range(30)))
    settings = RecoverySettings(layers=(1, 2), sigma=3.0, steps=3, lr=1e-2, batch_size=2, block_size=16,
                                train_blocks=4, train_file=str(train), eval_file=eval_file, eval_batch_size=2,
                                eval_every=1)  # not auto: chosen from the measured step time, it varies with load
    full = RecoveryResult.from_json(next(e for e in run_recovery(model, tokenizer, settings, model_name="tiny")
                                         if isinstance(e, Result)).data)  # fmt: skip
    token = CancelToken()
    events = []
    with pytest.raises(Cancelled):
        for event in run_recovery_entry(settings, _context(loaded_tiny(tiny_llama), tmp_path / "cp", token)):
            events.append(event)
            if isinstance(event, RecoveryLayer):
                token.cancel()
    partial = RecoveryResult.from_json(cast(Result, events[-1]).data)
    assert partial.partial is True and partial.partial_text() == "partial: 1 of 2 layers"
    assert [row.layer for row in partial.layers] == [1]
    for name in ("curve", "steps_to", "final_ppl", "train_loss", "difficulty"):  # not its times: those vary
        assert getattr(partial.layers[0], name) == getattr(full.layers[0], name), name
    resumed = list(run_recovery_entry(settings, _context(loaded_tiny(tiny_llama), tmp_path / "cp", resume=True)))
    whole = RecoveryResult.from_json(cast(Result, resumed[-1]).data)
    assert whole.partial is ABSENT and [row.layer for row in whole.layers] == [1, 2] and whole.resumed_layers == [1]
    assert [row.curve for row in whole.layers] == [row.curve for row in full.layers]
