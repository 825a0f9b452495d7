"""`anatomy-tui run` at scale: the memory plan before the load, --device-map/--max-memory flags, and
--shards giving the serial run's rows: once end to end through torch's launcher (the relaunch, rank 0
the one writer), and for every other experiment as rank 0 of a world whose shares run in this
process (tests/in_process_workers.py), which proves the split, the merge and resume without
starting processes."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
import torch
from in_process_workers import rank_zero_here

from cli.main import build_parser, main
from sessions.session import Session
from sessions.store import SessionStore


def stored(session: Session, result: str) -> dict[str, Any]:
    """Result `result` of `session`, which the run before wrote."""
    doc = session.load_result(result)
    assert doc is not None
    return doc


def only_job(session: str) -> dict:
    (doc,) = SessionStore().open(session).jobs().values()
    return doc


def test_the_memory_plan_is_printed_and_recorded(tiny_folder, capsys):
    from transformers import AutoModelForCausalLM

    assert main(["run", "ablation", "--model", str(tiny_folder), "--eval-set", "paper", "--session", "p"]) == 0
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if line.startswith("memory plan on cpu (float32): weights ")]
    plan = only_job("p")["spec"]["memory_plan"]
    params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(tiny_folder).parameters())
    assert plan["device"] == "cpu" and plan["weights"] == 4 * params
    assert plan["prefix_cache"] > 0 and plan["total"] == sum(
        plan[part] for part in ("weights", "prefix_cache", "activations", "logits", "training"))


def test_a_plan_that_does_not_fit_stops_before_the_load(tiny_folder, monkeypatch, capsys):
    import engine.models.loading
    import engine.models.memory

    def no_load(*args, **kwargs):
        raise AssertionError("the model must not load")

    monkeypatch.setattr(engine.models.memory, "free_memory", lambda device: 1000)
    monkeypatch.setattr(engine.models.loading, "load_model", no_load)
    assert main(["run", "ablation", "--model", str(tiny_folder), "--eval-set", "paper", "--session", "q"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith("anatomy-tui: error: ablation needs about ")
    assert "0.00 GB is free" in errors[0] and "try " in errors[0]
    assert not SessionStore().exists("q")


def test_a_model_that_cannot_be_planned_is_loaded_with_a_note(tiny_folder, monkeypatch, capsys):
    import engine.models.memory

    def offline(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co'\nmore")

    monkeypatch.setattr(engine.models.memory, "plan_run", offline)
    assert main(["run", "ablation", "--model", str(tiny_folder), "--eval-set", "paper", "--session", "n"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert "memory plan skipped (We couldn't connect to 'https://huggingface.co'); loading the model" in err
    assert "memory_plan" not in only_job("n")["spec"]


def test_device_map_and_max_memory_flags(tiny_folder, capsys):
    from cli.flags import model_options_from_args

    console = build_parser().parse_args(["--device-map", "auto", "--max-memory", "0=14GiB,cpu=30GiB"])
    options = model_options_from_args(console)
    assert (options.device_map, options.max_memory) == ("auto", "0=14GiB,cpu=30GiB")
    assert model_options_from_args(build_parser().parse_args(["--device-map", "none"])).device_map is None
    run = build_parser("ablation").parse_args(["run", "ablation", "--device-map", "sequential"])
    assert model_options_from_args(run).device_map == "sequential"
    cases = [
        (["--shards", "2", "--device-map", "auto"], "use one of them"),
        (["--shards", "2", "--device", "cuda:1"], "every worker on that one GPU"),
        (["--max-memory", "0=14"], "--max-memory size '14' not understood"),
        (["--max-memory", "0=14GiB"], "--max-memory names device 0, but this streamed map runs on cpu"),
    ]
    for flags, fragment in cases:
        assert main(["run", "ablation", "--model", str(tiny_folder), *flags]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith("anatomy-tui: error: ") and fragment in line
    assert main(["run", "toy-depth", "--preset", "tiny", "--shards", "2", "--device", "cuda:0"]) == 2
    assert "use --device auto: each worker takes its own GPU" in capsys.readouterr().err
    assert main(["run", "dynamics", "--shards", "2"]) == 2  # not a flag of dynamics: one line
    assert "unknown flag --shards" in capsys.readouterr().err


def test_torchrun_refuses_an_experiment_that_does_not_split(tiny_folder, monkeypatch, capsys):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["run", "dynamics", "--model", str(tiny_folder)]) == 2
    assert "dynamics does not split over workers" in capsys.readouterr().err


def serially(argv: list[str]) -> int:
    """A run in this process with each shard's thread count, so every sum is reduced alike."""
    from engine.models.distributed import cpu_threads

    threads = torch.get_num_threads()
    torch.set_num_threads(cpu_threads(2))
    try:
        return main(argv)
    finally:
        torch.set_num_threads(threads)


def logged(session) -> list[dict]:
    return [json.loads(line) for line in (session.path / "events.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_two_shards_give_the_serial_map(tiny_folder, worker_env, capsys):
    """End to end through torch's launcher: --shards relaunches the command as two processes, the
    events travel to rank 0 over gloo (progress summed over the workers) and rank 0 alone writes."""
    argv = ["run", "ablation", "--model", str(tiny_folder), "--eval-set", "paper", "--eval-batch-size", "4"]
    assert main([*argv, "--shards", "2", "--session", "sharded"]) == 0
    assert serially([*argv, "--session", "serial"]) == 0
    store = SessionStore()
    sharded, serial = store.open("sharded"), store.open("serial")
    assert stored(sharded, "ablation")["layers"] == stored(serial, "ablation")["layers"]
    assert stored(sharded, "ablation")["spearman"] == stored(serial, "ablation")["spearman"]
    assert stored(sharded, "ablation")["baseline_ppl"] == stored(serial, "ablation")["baseline_ppl"]
    events = logged(sharded)
    assert sorted(e["layer"] for e in events if e["kind"] == "ablation.layer") == [0, 1, 2, 3]
    assert [e["kind"] for e in events][-2:] == ["job.result", "job.finished"]
    progress = [e for e in events if e["kind"] == "job.progress"]
    assert (progress[-1]["done"], progress[-1]["total"]) == (4, 4)  # summed over the two workers
    assert len(sharded.jobs()) == 1 and only_job("sharded")["status"] == "done"  # one writer, one job
    assert only_job("sharded")["pid"] != os.getpid()  # written by rank 0 of the launched workers


def test_sharded_recovery_by_layer_and_repeat_resumes_the_missing_layers(tiny_folder, tmp_path, monkeypatch,
                                                                        capsys):
    train, held_out = tmp_path / "train.txt", tmp_path / "eval.txt"
    train.write_text("\n".join(f"The cat {i} sat on the mat." for i in range(40)), encoding="utf-8")
    held_out.write_text("The dog sat on the mat.\nA cat looked at the dog.", encoding="utf-8")
    argv = ["run", "recovery", "--model", str(tiny_folder), "--sigma", "3", "--steps", "2", "--lr", "0.01",
            "--batch-size", "2", "--block-size", "16", "--train-blocks", "4", "--train-file", str(train),
            "--eval-file", str(held_out), "--repeats", "2",
            "--eval-every", "1"]  # not auto: chosen from the measured step time, it differs between loaded runs
    assert main([*argv, "--layers", "1,2", "--session", "r"]) == 0  # a sweep stopped after two layers
    with rank_zero_here(monkeypatch):
        assert main([*argv, "--layers", "0,1,2,3", "--session", "r", "--resume", "--shards", "2"]) == 0
    assert main([*argv, "--layers", "0,1,2,3", "--session", "fresh"]) == 0
    store = SessionStore()
    resumed, fresh = stored(store.open("r"), "recovery"), stored(store.open("fresh"), "recovery")
    assert resumed["resumed_layers"] == [1, 2]
    assert [len(row["repeats"]) for row in resumed["layers"]] == [2, 2, 2, 2]  # (layer, repeat) runs joined again
    got, want = untimed(resumed["layers"]), untimed(fresh["layers"])
    assert got == want, differences(got, want)
    assert resumed["budget"] == fresh["budget"] and resumed["ranking"] == fresh["ranking"]
    layers = [e for e in logged(store.open("r")) if e["kind"] == "recovery.layer"]  # the log holds whole layers only
    assert sorted(e["layer"] for e in layers) == [0, 1, 2, 3] and {len(e["result"]["repeats"]) for e in layers} == {2}
    checkpoint = json.loads((store.open("r").checkpoint_dir("recovery") / "layers.json").read_text())
    assert sorted(checkpoint["layers"], key=int) == ["0", "1", "2", "3"]


def test_shards_take_one_gpu_each(tiny_folder, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert main(["run", "ablation", "--model", str(tiny_folder), "--shards", "2"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == ("anatomy-tui: error: --shards 2 but 1 GPU(s) are visible here: one worker per GPU, "
                    "so at most 1 on this machine")


def differences(got, want, at="") -> list[str]:
    """Where two documents differ, as paths with both values (a failed comparison's message)."""
    if isinstance(got, dict) and isinstance(want, dict):
        return [d for k in sorted({*got, *want}) for d in differences(got.get(k), want.get(k), f"{at}.{k}")]
    if isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
        return [d for i, (g, w) in enumerate(zip(got, want, strict=True)) for d in differences(g, w, f"{at}[{i}]")]
    return [] if got == want else [f"{at}: {got!r} != {want!r}"]


def untimed(doc):
    """A result without its wall-clock times (every `seconds...` key, at any depth)."""
    if isinstance(doc, dict):
        return {k: untimed(v) for k, v in doc.items() if not k.startswith("seconds")}
    return [untimed(v) for v in doc] if isinstance(doc, list) else doc


def test_two_shards_give_the_serial_manipulation_trials(tiny_folder, monkeypatch, capsys):
    argv = ["run", "manipulate", "--model", str(tiny_folder), "--eval-set", "paper", "--eval-batch-size", "4",
            "--layers", "1,2", "--strategies", "zero,blend,scale", "--alphas", "0.5,0.9", "--together",
            "--sample-tokens", "3"]
    with rank_zero_here(monkeypatch):
        assert main([*argv, "--shards", "2", "--session", "sharded"]) == 0
    assert main([*argv, "--session", "serial"]) == 0
    store = SessionStore()
    sharded, serial = stored(store.open("sharded"), "manipulate"), stored(store.open("serial"), "manipulate")
    assert len(serial["results"]) == 12 and serial["results"][-1]["together"]
    assert untimed(sharded) == untimed(serial)
    assert sum(e["kind"] == "manipulate.trial" for e in logged(store.open("sharded"))) == 12


def test_two_shards_give_the_serial_toy_depth_and_resume_a_lost_student(monkeypatch, capsys):
    argv = ["run", "toy-depth", "--preset", "tiny", "--width", "8", "--outputs", "8", "--teacher-depth", "4",
            "--student-depths", "1,2,3", "--steps", "20", "--batch-size", "16", "--eval-size", "64",
            "--bootstrap", "20", "--log-every", "10"]
    with rank_zero_here(monkeypatch):
        assert main([*argv, "--shards", "2", "--session", "sharded"]) == 0
    assert main([*argv, "--session", "serial"]) == 0
    store = SessionStore()
    sharded, serial = store.open("sharded"), store.open("serial")
    assert untimed(sharded.load_result("toy-depth")) == untimed(serial.load_result("toy-depth"))

    def fit_lines(session) -> set[str]:
        return {e["text"] for e in logged(session) if e["kind"] == "job.message" and "alpha_l=" in e["text"]}

    assert len(fit_lines(serial)) == 2 and fit_lines(sharded) == fit_lines(serial)  # logged after the merge
    folder = sharded.checkpoint_dir("toy-depth")
    assert len(list(folder.glob("student-*.json"))) == 6  # two regimes x three depths, one file each
    (folder / "student-independent-T1.0-d2.json").unlink()  # a student killed before it finished
    with rank_zero_here(monkeypatch):
        assert main([*argv, "--shards", "2", "--session", "sharded", "--resume"]) == 0
    assert untimed(sharded.load_result("toy-depth")) == untimed(serial.load_result("toy-depth"))
    restored = [e for e in logged(sharded)
                if e["kind"] == "job.message" and "restored from its checkpoint" in e["text"]]
    assert len(restored) == 5
