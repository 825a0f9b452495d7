"""Growth training: parameter matching, cloning, the phase table, growth, resume, saved models."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import pytest
import torch
from tui_fixtures import ablation_map, round_trips

from engine.core.errors import UserError
from engine.core.events import Cancelled, CancelToken, Result, event_from_json
from engine.evaluation.generation import generate_text
from engine.experiments.ablation.vocabulary import AblationMap, AblationRow
from engine.experiments.growth.architecture import (
    GrowingModel,
    build_model,
    clone_layer,
    growth_widths,
    load_growth_model,
    param_count,
)
from engine.experiments.growth.data import CharTokenizer, load_corpus, train_batch
from engine.experiments.growth.design import design
from engine.experiments.growth.experiment import preset_settings, run_growth
from engine.experiments.growth.profile import PAPER_PROFILE, multipliers_dict, parse_profile, profile_from_ablation
from engine.experiments.growth.protocol import (
    Phase,
    derive_phases,
    layer_steps,
    load_phases,
    scale_phases,
    validate_phases,
)
from engine.experiments.growth.vocabulary import GrowthPhase, GrowthSettings, GrowthStep

# six layers: one anti (omitted), a critical core wider than its clones, a redundant layer cloned x0.5
SMALL_PROFILE = ("redundant", "important", "critical", "minor", "anti", "redundant")


def small_settings(**changes):
    base = dict(
        preset="test", profile=SMALL_PROFILE, hidden_size=16, heads=2, base_ffn=8, seq_len=16, batch_size=2,
        steps=24, lr=3e-3, eval_every=6, eval_batches=1, checkpoint_every=5, gen_tokens=4, threads=1,
    )  # fmt: skip
    base.update(changes)
    return preset_settings("tiny", **base)


@pytest.fixture(scope="module")
def vocab() -> int:
    return load_corpus().tokenizer.vocab_size


# --- parameter matching -----------------------------------------------------------------------


@pytest.mark.parametrize("preset", ["paper", "tiny"])
def test_uniform_baseline_matches_parameter_count(preset, vocab):
    settings = preset_settings(preset)
    plan = design(settings, vocab, 400_000)
    growth, uniform = plan.params["growth"], plan.params["uniform"]
    assert abs(uniform - growth) / growth < 0.01
    assert len(plan.arms["uniform_100"].widths) == len(plan.arms["growth_100"].widths) == 12
    if preset == "paper":
        assert 9.4e6 < growth < 9.7e6  # the paper's 9.57 M


def test_param_count_formula_is_the_real_count(vocab):
    widths = growth_widths(SMALL_PROFILE, 8, multipliers_dict((("critical", 4), ("important", 2),
                                                              ("minor", 2), ("redundant", 1))))  # fmt: skip
    assert widths == [8, 16, 32, 16, 8]  # anti omitted
    for uniform, w in ((False, widths), (True, [13] * 5)):
        model = build_model(vocab, 16, 2, w, 16, 0, uniform)
        assert sum(p.numel() for p in model.parameters()) == param_count(vocab, 16, w)


# --- cloning ----------------------------------------------------------------------------------


def _layers(widths):
    model = build_model(50, 16, 2, widths, 16, 0, False)
    with torch.no_grad():  # distinct, non-trivial norms so a copy is visible
        for p in model.parameters():
            p.normal_()
    return list(model.model.layers)


def test_clone_copies_exactly_and_scales_the_ffn():
    src, dst = _layers([12, 12])
    clone_layer(src, dst, 1.0)
    for (name, a), (_, b) in zip(src.state_dict().items(), dst.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    src, dst = _layers([12, 12])
    clone_layer(src, dst, 0.5)
    assert torch.equal(dst.mlp.down_proj.weight, src.mlp.down_proj.weight * 0.5)
    assert torch.equal(dst.mlp.up_proj.weight, src.mlp.up_proj.weight)
    assert torch.equal(dst.self_attn.q_proj.weight, src.self_attn.q_proj.weight)
    assert torch.equal(dst.input_layernorm.weight, src.input_layernorm.weight)


def test_clone_to_other_widths_keeps_the_function():
    x = torch.randn(3, 5, 16)
    src, narrow, wide = _layers([12, 6, 20])
    with torch.no_grad():  # only neurons 0..5 of the source matter, so a 6-wide clone is exact
        src.mlp.down_proj.weight[:, 6:] = 0
    clone_layer(src, narrow, 0.5)
    clone_layer(src, wide, 0.5)
    assert torch.equal(narrow.mlp.gate_proj.weight, src.mlp.gate_proj.weight[:6])
    expected = src.mlp(x) * 0.5
    assert torch.allclose(narrow.mlp(x), expected, atol=1e-5)
    assert torch.allclose(wide.mlp(x), expected, atol=1e-5)


# --- the phase table --------------------------------------------------------------------------


def test_paper_phases_and_budgets():
    phases = scale_phases(derive_phases(PAPER_PROFILE), 656)
    assert [p.name for p in phases] == [
        "gastrulation", "neurulation", "organogenesis", "growth", "connective", "maturation",
    ]  # fmt: skip
    assert [p.steps for p in phases] == [191, 127, 127, 77, 38, 96]
    assert [sorted(set(p.layers) - set(q.layers)) for p, q in zip(phases[1:], phases, strict=False)] == [
        [1, 2], [8, 9], [7, 10], [0, 3, 6, 11], [],
    ]  # fmt: skip
    assert phases[0].layers == (4, 5) and phases[4].ffn_scale == 0.5
    assert dict(phases[1].clone_from) == {1: 4, 2: 4}
    steps = layer_steps(phases)
    assert steps[4] == 656 and steps[0] == 38 + 96
    assert sum(p.steps for p in scale_phases(phases, 328)) == 328


@pytest.mark.parametrize(
    "phases, message",
    [
        ([Phase("a", (4, 5), steps=1), Phase("b", (4, 5, 12), steps=1)], "unknown layer 12"),
        ([Phase("a", (4,), steps=1), Phase("b", (4, 1), clone_from=((1, 7),), steps=1)], "not trained yet"),
        ([Phase("a", (), steps=1)], "is empty"),
        ([Phase("a", (4, 5))], "zero length"),
        ([Phase("a", (4, 5), steps=2), Phase("b", (5, 6), steps=2)], "drops layer 4"),
        ([Phase("a", (4, 5), steps=2)], "never trained"),
    ],
)
def test_phase_validation_errors(phases, message):
    with pytest.raises(UserError, match=message) as info:
        validate_phases(phases, PAPER_PROFILE)
    assert "\n" not in str(info.value)


def test_phase_tables_load_from_toml_and_json(tmp_path):
    toml = tmp_path / "p.toml"
    toml.write_text(
        '[[phases]]\nname = "core"\nlayers = [2]\nepochs = 2\n\n'
        '[[phases]]\nname = "all"\nlayers = [0, 1, 2, 3, 5]\nclone_from = {"0" = 2}\n'
        "ffn_scale = 0.5\nsteps = 3\n"
    )
    phases = validate_phases(load_phases(toml), SMALL_PROFILE)
    assert phases[1].sources() == {0: 2, 1: 2, 3: 2, 5: 2}  # named, else nearest trained (only 2)
    as_json = tmp_path / "p.json"
    as_json.write_text(json.dumps({"phases": [{"name": "x", "layers": [2], "steps": 1, "bogus": 1}]}))
    with pytest.raises(UserError, match="unknown key 'bogus'"):
        load_phases(as_json)


def test_profile_from_ablation_compresses_by_the_documented_rule():
    classes = ["redundant", "critical", "minor", "minor", "important", "redundant"]
    doc = AblationMap.from_json(ablation_map([AblationRow(i, 1.0, 1.0, c, anti=i in (2, 3))
                                              for i, c in enumerate(classes)]))
    assert profile_from_ablation(doc, 3) == ("critical", "anti", "important")
    six = ("redundant", "critical", "anti", "anti", "important", "redundant")
    assert profile_from_ablation(doc, 6) == six
    with pytest.raises(UserError):
        parse_profile("critical,bogus")


# --- training ---------------------------------------------------------------------------------


def test_the_network_grows():
    settings = small_settings(arms=("growth_100",))
    plan = design(settings, 104, 400_000)
    assert [len(p.layers) for p in plan.arms["growth_100"].phases] == [1, 2, 3, 5, 5]
    events = list(run_growth(settings))
    steps = [e for e in events if isinstance(e, GrowthStep)]
    assert [e.step for e in steps] == list(range(1, 25))
    sizes = [e.n_layers for e in steps]
    assert sizes == sorted(sizes) and sizes[0] == 1 and sizes[-1] == 5
    added = [[a["layer"] for a in e.added] for e in events if isinstance(e, GrowthPhase)]
    assert added == [[], [1], [3], [0, 5], []]


def test_only_existing_layers_train():
    model = build_model(30, 16, 2, [8, 8, 8], 16, 0, False)
    grow = GrowingModel(model, [0, 1, 2])
    before = {n: p.detach().clone() for n, p in grow.named.items()}
    grow.set_active([1])
    optimizer = torch.optim.AdamW(list(grow.named.values()), lr=1e-2)
    batch = train_batch(torch.randint(0, 30, (200,)), 0, 0, 2, 16)
    model(batch[:, :-1]).logits.sum().backward()
    optimizer.step()
    changed = {
        n.split(".")[2] for n, p in grow.named.items() if "layers" in n and not torch.equal(p, before[n])
    }
    assert changed == {"1"}


@pytest.mark.parametrize("dtype", ["float32", "float16"])  # float16: the loss scaler resumes too
def test_resume_equals_uninterrupted(tmp_path, dtype):
    settings = small_settings(device="cpu", dtype=dtype)
    whole = list(run_growth(settings, checkpoint_dir=tmp_path / "a", model_dir=tmp_path / "ma"))
    expected = next(e.data for e in whole if isinstance(e, Result))

    cancel = CancelToken()
    seen = []
    with pytest.raises(Cancelled):
        for event in run_growth(settings, cancel, checkpoint_dir=tmp_path / "b", model_dir=tmp_path / "mb"):
            seen.append(event)
            if isinstance(event, GrowthStep) and event.arm == "growth_50" and event.step == 7:
                cancel.cancel()
    assert not any(isinstance(e, Result) for e in seen)
    resumed = list(
        run_growth(settings, checkpoint_dir=tmp_path / "b", model_dir=tmp_path / "mb", resume=True)
    )
    got = next(e.data for e in resumed if isinstance(e, Result))
    first = next(e for e in resumed if isinstance(e, GrowthStep))
    assert first.arm == "growth_50" and 1 < first.step <= 8  # from its last checkpoint, not from 0
    for arm in ("growth_100", "growth_50", "uniform_100"):
        assert got["arms"][arm]["val_loss"] == pytest.approx(expected["arms"][arm]["val_loss"], abs=1e-6)
        # the loss curve too: the evaluations before the stop travel in the checkpoint
        whole_arm = expected["arms"][arm]
        phase_ends = itertools.accumulate(phase["steps"] for phase in whole_arm["phases"])
        curve = torch.tensor(whole_arm["curve"], dtype=torch.float64)  # every 6 steps and at each phase's end
        assert curve[:, 0].tolist() == sorted({*range(6, whole_arm["steps"] + 1, 6), *phase_ends})
        torch.testing.assert_close(torch.tensor(got["arms"][arm]["curve"], dtype=torch.float64), curve)
    assert got["generations"] == expected["generations"]
    with pytest.raises(UserError, match="other settings"):
        list(run_growth(dataclasses.replace(settings, lr=1e-3), checkpoint_dir=tmp_path / "b", resume=True))


def test_saved_models_load_with_automodel(tmp_path):
    settings = small_settings(steps=6, arms=("growth_100", "uniform_100"), checkpoint_every=0)
    doc = next(e.data for e in run_growth(settings, model_dir=tmp_path) if isinstance(e, Result))
    assert set(doc) >= {"preset", "params", "arms", "phases", "generations", "budget_table"}
    assert round_trips("growth", doc)  # built from GrowthResult, read back the same
    assert len(doc["generations"]) == 12
    for arm in ("growth_100", "uniform_100"):
        model, tokenizer = load_growth_model(tmp_path / arm)
        assert isinstance(tokenizer, CharTokenizer)
        assert (
            sum(p.numel() for p in model.parameters())
            == doc["params"]["growth" if arm[0] == "g" else "uniform"]
        )
        row = doc["generations"][0]
        again = generate_text(model, tokenizer, row["prompt"], settings.gen_tokens, context=settings.seq_len)
        assert again == row[arm]
    widths = [
        layer.mlp.gate_proj.out_features
        for layer in load_growth_model(tmp_path / "growth_100")[0].model.layers
    ]
    assert widths == [8, 16, 32, 16, 8]


def test_settings_and_events_round_trip():
    settings = small_settings(phases=(Phase("a", (0, 1, 2, 3, 5), steps=3),))
    assert GrowthSettings.from_dict(json.loads(json.dumps(settings.to_dict()))) == settings
    event = GrowthPhase(arm="growth_100", seed=0, phase="a", phase_index=0, start_step=0, steps=3, layers=[1],
                        added=[{"layer": 1, "source": 2, "ffn_scale": 0.5}])  # fmt: skip
    assert event_from_json(json.loads(json.dumps(event.to_json()))) == event


def test_cli_parses_growth_flags(tmp_path):
    from cli.flags import settings_from_args
    from cli.main import build_parser
    from engine.registry import experiment

    def parsed(*flags):
        return settings_from_args(experiment("growth"), build_parser("growth").parse_args(["run", "growth", *flags]))

    settings = parsed("--preset", "tiny", "--seeds", "3", "--steps", "50")
    assert settings.seeds == (0, 1, 2) and settings.steps == 50 and settings.hidden_size == 64
    assert parsed("--seeds", "4,").seeds == (4,) and parsed().preset == "paper"
    table = tmp_path / "p.json"
    table.write_text(json.dumps([{"name": "all", "layers": list(range(12)), "epochs": 1}]))
    assert parsed("--phases", str(table)).steps == 0  # a table without --steps runs at its own lengths
    assert parsed("--phases", str(table), "--steps", "9").steps == 9


def test_a_seed_count_past_any_run_is_one_line(capsys):
    """A count too large for range() (found by the property test) is refused like any bad flag."""
    from cli.main import main

    assert main(["run", "growth", "--preset", "tiny", "--seeds", "1" * 30]) == 2
    assert "--seeds 111111111111111111111111111111: must be" in capsys.readouterr().err


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_growth_follows_float32(dtype):
    """Mixed precision: float32 weights and AdamW, the forward autocast to the half dtype."""
    docs = {}
    for kind in ("float32", dtype):
        settings = small_settings(steps=12, arms=("growth_100",), checkpoint_every=0, device="cpu", dtype=kind)
        events = list(run_growth(settings))
        docs[kind] = next(e.data for e in events if isinstance(e, Result))
    assert docs[dtype]["settings"]["dtype"] == dtype and docs[dtype]["settings"]["device"] == "cpu"
    full, half = docs["float32"]["arms"]["growth_100"]["mean"], docs[dtype]["arms"]["growth_100"]["mean"]
    assert math.isfinite(half) and abs(half - full) <= 0.03 * full


def test_training_runs_keep_float32_weights_under_autocast(vocab):
    from engine.experiments.growth.trainer import ArmPlan, TrainConfig, train_arm

    config = TrainConfig(vocab_size=vocab, hidden_size=16, heads=2, seq_len=16, batch_size=2, lr=3e-3,
                         warmup_frac=0.1, weight_decay=0.0, grad_clip=1.0, eval_every=100, checkpoint_every=0,
                         device="cpu", dtype="bfloat16")
    corpus = load_corpus()
    plan = ArmPlan("uniform", (Phase("uniform", (0, 1), steps=3),), (8, 8), True)
    run = train_arm(plan, 0, config, (0, 1), corpus.train, [corpus.val[:34].view(2, 17)])
    while True:
        try:
            next(run)
        except StopIteration as done:
            outcome = done.value
            break
    assert all(p.dtype == torch.float32 for p in outcome.model.model.parameters())
    with pytest.raises(UserError, match="--device gpu: must be auto, cpu, cuda or cuda:N"):
        list(run_growth(small_settings(device="gpu")))  # refused with the settings, before any run


def test_float16_resume_continues_with_the_saved_loss_scale(tmp_path):
    """The GradScaler's state is in the checkpoint's JSON: a resumed float16 run goes on from the
    saved scale and growth counter (a scale that grows after 2000 clean steps), not from a fresh one."""
    settings = small_settings(steps=12, arms=("uniform_100",), checkpoint_every=5, device="cpu", dtype="float16")

    def run_until(step: int, resume: bool) -> None:
        cancel = CancelToken()
        with pytest.raises(Cancelled):
            for event in run_growth(settings, cancel, checkpoint_dir=tmp_path, resume=resume):
                if isinstance(event, GrowthStep) and event.step == step:
                    cancel.cancel()

    run_until(6, resume=False)
    path = tmp_path / "state.json"
    state = json.loads(path.read_text(encoding="utf-8"))
    assert state["arm"]["step"] == 5
    assert state["arm"]["scaler"] == {"scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                                      "growth_interval": 2000, "_growth_tracker": 5}
    state["arm"]["scaler"].update(scale=1024.0, _growth_tracker=1996)  # four clean steps from doubling
    path.write_text(json.dumps(state), encoding="utf-8")
    run_until(11, resume=True)
    after = json.loads(path.read_text(encoding="utf-8"))["arm"]
    assert after["step"] == 10 and after["scaler"]["scale"] == 2048.0 and after["scaler"]["_growth_tracker"] == 1


def finished(run):
    """Drives a generator to its end: (the events it yielded, the value it returned)."""
    events = []
    while True:
        try:
            events.append(next(run))
        except StopIteration as done:
            return events, done.value


def test_step_losses_are_read_from_the_device_once_per_report(monkeypatch, vocab):
    """Each step's loss stays on the device and the host reads them together at a report point (an
    evaluation, a checkpoint, a phase end; on a GPU each read waits for the queued work), and every
    step still gets its event with its own loss, rate and learning rate."""
    import sys
    from pathlib import Path

    from engine.experiments.growth.trainer import ArmPlan, TrainConfig, learning_rate, train_arm

    engine_dir = str(Path(train_arm.__code__.co_filename).parents[2])
    reads = []

    def counted(name):
        method = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            if self.is_floating_point() and sys._getframe(1).f_code.co_filename.startswith(engine_dir):
                reads.append(name)  # a loss read by the engine (token ids read on the host do not wait)
            return method(self, *args, **kwargs)

        return read

    for name in ("item", "tolist", "__float__"):
        monkeypatch.setattr(torch.Tensor, name, counted(name))
    losses = []
    cross_entropy = torch.nn.functional.cross_entropy

    def kept(*args, **kwargs):
        loss = cross_entropy(*args, **kwargs)
        if torch.is_grad_enabled():
            losses.append(loss.detach().clone())
        return loss

    monkeypatch.setattr(torch.nn.functional, "cross_entropy", kept)
    config = TrainConfig(vocab_size=vocab, hidden_size=16, heads=2, seq_len=16, batch_size=2, lr=3e-3,
                         warmup_frac=0.1, weight_decay=0.0, grad_clip=1.0, eval_every=6, checkpoint_every=0)
    corpus = load_corpus()
    plan = ArmPlan("uniform", (Phase("uniform", (0, 1), steps=12),), (8, 8), True)
    events, _ = finished(train_arm(plan, 0, config, (0, 1), corpus.train, [corpus.val[:34].view(2, 17)]))
    assert len(reads) <= 5  # reports after steps 6 and 12: their losses and validation loss; the final evaluation
    steps = [e for e in events if isinstance(e, GrowthStep)]
    assert [e.step for e in steps] == list(range(1, 13))
    assert [e.train_loss for e in steps] == [float(loss) for loss in losses]
    assert [e.lr for e in steps] == [learning_rate(step, 12, 3e-3, 0.1) for step in range(12)]
    assert all(e.tokens_per_s > 0 and e.n_layers == 2 and e.total_steps == 12 for e in steps)


def test_out_of_memory_in_training_is_one_line(monkeypatch):
    from engine.models import oom

    freed = []
    monkeypatch.setattr(oom, "release_memory", lambda: freed.append(True))
    cross_entropy = torch.nn.functional.cross_entropy

    def out_of_memory(*args, **kwargs):
        if torch.is_grad_enabled():
            raise torch.OutOfMemoryError("CUDA out of memory")
        return cross_entropy(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "cross_entropy", out_of_memory)
    with pytest.raises(UserError, match=r"^out of memory in growth training of uniform_100; try .*--batch-size"
                       ) as info:
        list(run_growth(small_settings(steps=6, arms=("uniform_100",), checkpoint_every=0)))
    assert "\n" not in str(info.value) and freed == [True]
