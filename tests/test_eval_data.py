"""Evaluation text from datasets (engine/data/eval_data.py): the SPEC, local files of each kind, the hub
through a stand-in `datasets.load_dataset`, the papers' protocol and the sliding window against
independent loops over the model's own loss, calibration windows, the protocol a result records,
and `run ablation --eval-dataset` end to end. The hubs are unreachable here: every text is local."""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import datasets
import pytest
import torch
from tiny_models import byte_tokenizer, tiny_model

from cli.main import main
from engine.core.errors import UserError
from engine.core.events import Result
from engine.data.dataset_texts import DatasetSpec, load_texts
from engine.data.eval_data import calibration_blocks, comparable, cut_windows, eval_source
from engine.evaluation.perplexity import Evaluator
from engine.experiments.ablation.vocabulary import AblationMap, AblationSettings

# wikitext-like rows: headings, paragraphs, empty rows (as the hub's wikitext has them)
ROWS = [
    "",
    " = Valley of the Mills = \n",
    "",
    " The valley holds three old mills , each turned by the same small river that runs from the hills . \n",
    " In 1887 the lower mill burned , and the town rebuilt it in stone over two summers . \n",
    "",
    " = = Geography = = \n",
    " The river falls forty metres over six kilometres , fast enough to turn a wheel in every season . \n",
    " Farmers brought grain from the plateau on carts , and the millers kept a tenth of it as their fee . \n",
    " Today the upper mill is a museum , and the middle one grinds flour for two bakeries in the town . \n",
]


@pytest.fixture(autouse=True)
def _fresh_cache():
    load_texts.cache_clear()  # each test's files are new, under the same names
    yield
    load_texts.cache_clear()


def write_all(folder) -> dict[str, Any]:
    """The same rows as a text file (a row a line), JSON lines and parquet."""
    lines = [row.rstrip("\n") for row in ROWS]
    txt, jsonl, parquet = folder / "wiki.txt", folder / "wiki.jsonl", folder / "wiki.parquet"
    txt.write_text("\n".join(lines) + "\n", encoding="utf-8")
    jsonl.write_text("\n".join(json.dumps({"text": line, "id": i}) for i, line in enumerate(lines)), encoding="utf-8")
    datasets.Dataset.from_dict({"text": lines}).to_parquet(str(parquet))
    return {"txt": str(txt), "jsonl": str(jsonl), "parquet": str(parquet), "lines": lines}


def settings(path: str, **changes) -> AblationSettings:
    return AblationSettings(eval_dataset=path, **changes)


# --- the SPEC and loading ----------------------------------------------------------------------


def test_spec_names_a_hub_dataset_its_config_and_split(tmp_path):
    assert DatasetSpec.parse("wikitext:wikitext-2-raw-v1:test") == DatasetSpec(
        "wikitext", "wikitext-2-raw-v1", "test", False)
    assert DatasetSpec.parse("allenai/c4:en:validation") == DatasetSpec("allenai/c4", "en", "validation", False)
    assert DatasetSpec.parse("wikitext") == DatasetSpec("wikitext", None, None, False)
    (tmp_path / "a.txt").write_text("x\n")
    assert DatasetSpec.parse(str(tmp_path / "a.txt")).local
    for bad in ("a:b:c:d", "a::b", "./missing.txt", "/nope/x.parquet"):
        with pytest.raises(UserError, match="NAME\\[:CONFIG\\]\\[:SPLIT\\]"):
            DatasetSpec.parse(bad)


def test_every_local_kind_reads_the_same_texts(tmp_path):
    paths = write_all(tmp_path)
    for kind in ("txt", "jsonl", "parquet"):
        loaded = load_texts(paths[kind], "test", "text")
        assert list(loaded.texts) == paths["lines"], kind
    with pytest.raises(UserError, match="no column 'body'.*--text-column"):
        load_texts(paths["parquet"], "test", "body")
    with pytest.raises(UserError, match="no 'body' field"):
        load_texts(paths["jsonl"], "test", "body")


def test_a_folder_picks_its_split_from_the_file_names(tmp_path):
    folder = tmp_path / "wiki"
    folder.mkdir()
    datasets.Dataset.from_dict({"text": ["train text"] * 3}).to_parquet(str(folder / "train-00000-of-00001.parquet"))
    datasets.Dataset.from_dict({"text": ROWS}).to_parquet(str(folder / "test-00000-of-00001.parquet"))
    loaded = load_texts(str(folder), "test", "text")
    assert list(loaded.texts) == ROWS and loaded.split == "test"
    assert list(load_texts(str(folder), "train", "text").texts) == ["train text"] * 3


def test_the_hub_is_asked_for_the_parsed_name_config_and_split(monkeypatch):
    calls = []

    def load_dataset(name, config=None, split=None, streaming=False, **kwargs):
        calls.append((name, config, split, streaming))
        local = datasets.Dataset.from_dict({"text": ROWS})
        return local.to_iterable_dataset() if streaming else local

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    loaded = load_texts("wikitext:wikitext-2-raw-v1:test", "test", "text")
    assert calls == [("wikitext", "wikitext-2-raw-v1", "test", False)] and list(loaded.texts) == ROWS
    load_texts("allenai/c4:en", "validation", "text", 100)  # bounded: streamed, read only as far as needed
    assert calls[-1] == ("allenai/c4", "en", "validation", True)
    load_texts.cache_clear()
    assert len(load_texts("allenai/c4:en", "validation", "text", 100).texts) < len(ROWS)


def test_an_unreachable_hub_and_a_missing_datasets_are_one_line(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'wikitext' on the Hub (LocalEntryNotFoundError)\nmore detail")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(UserError) as info:
        load_texts("wikitext:wikitext-2-raw-v1:test", "test", "text")
    assert "\n" not in str(info.value) and "Couldn't reach" in str(info.value)
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed
    load_texts.cache_clear()
    with pytest.raises(UserError, match=r"pip install 'anatomy-tui\[eval\]'"):
        load_texts("wikitext:wikitext-2-raw-v1:test", "test", "text")


# --- windows, against independent computations ---------------------------------------------------


def test_windows_of_the_papers_protocol_and_the_sliding_window():
    ids = list(range(10))
    papers = cut_windows(ids, 4)
    assert papers.rows == ((0, 1, 2, 3), (4, 5, 6, 7)) and papers.scored == (3, 3)  # 8, 9 dropped
    sliding = cut_windows(ids, 4, stride=2)
    assert sliding.rows == ((0, 1, 2, 3), (2, 3, 4, 5), (4, 5, 6, 7), (6, 7, 8, 9))
    assert sliding.scored == (3, 2, 2, 2) and sliding.tokens == 9  # every token after the first, once
    assert cut_windows(ids, 4, max_windows=1).rows == ((0, 1, 2, 3),)


def _model_loss(model, ids: torch.Tensor, labels: torch.Tensor) -> tuple[float, int]:
    """Summed NLL and count of a window from the model's own loss (transformers shifts the labels)."""
    counted = int((labels[:, 1:] != -100).sum())
    loss = model(input_ids=ids, labels=labels).loss
    return float(loss) * counted, counted


@torch.no_grad()
def papers_reference(model, tokenizer, texts, context: int) -> float:
    """The papers' loop (GPTQ/SLEB's eval): windows [i*ctx, (i+1)*ctx) of the one tokenized stream."""
    stream = tokenizer("\n\n".join(texts), return_tensors="pt").input_ids
    total: float = 0
    count = 0
    for i in range(stream.shape[1] // context):
        window = stream[:, i * context : (i + 1) * context]
        nll, n = _model_loss(model, window, window.clone())
        total, count = total + nll, count + n
    return math.exp(total / count)


@torch.no_grad()
def sliding_reference(model, tokenizer, texts, context: int, stride: int) -> float:
    """Hugging Face's perplexity guide (docs/transformers perplexity), with exact token counts."""
    encodings = tokenizer("\n\n".join(texts), return_tensors="pt")
    seq_len = encodings.input_ids.size(1)
    total: float = 0
    count = 0
    prev_end_loc = 0
    for begin_loc in range(0, seq_len, stride):
        end_loc = min(begin_loc + context, seq_len)
        trg_len = end_loc - prev_end_loc
        input_ids = encodings.input_ids[:, begin_loc:end_loc]
        target_ids = input_ids.clone()
        target_ids[:, :-trg_len] = -100
        nll, n = _model_loss(model, input_ids, target_ids)
        total, count = total + nll, count + n
        prev_end_loc = end_loc
        if end_loc == seq_len:
            break
    return math.exp(total / count)


@pytest.mark.parametrize("kind", ["txt", "jsonl", "parquet"])
def test_perplexity_by_the_papers_protocol_equals_the_papers_loop(kind, tmp_path):
    paths = write_all(tmp_path)
    model, tokenizer = tiny_model(), byte_tokenizer()
    source = eval_source(tokenizer, settings(paths[kind], context=64))
    evaluator = Evaluator(model, tokenizer, source, batch_size=3)
    expected = papers_reference(model, tokenizer, paths["lines"], 64)
    assert evaluator.perplexity() == pytest.approx(expected, rel=1e-5)
    stream = len(tokenizer("\n\n".join(paths["lines"]))["input_ids"])
    protocol = evaluator.protocol
    assert (protocol.protocol, protocol.context, protocol.stride) == ("papers", 64, None)
    assert protocol.windows == stream // 64 and protocol.tokens == evaluator.n_tokens == 63 * (stream // 64)
    # the prefix cache gives the same from any layer on
    evaluator.build_cache()
    assert evaluator.perplexity(2) == pytest.approx(expected, rel=1e-5)


def test_sliding_window_equals_the_perplexity_guides_loop(tmp_path):
    paths = write_all(tmp_path)
    model, tokenizer = tiny_model(), byte_tokenizer()
    source = eval_source(tokenizer, settings(paths["parquet"], context=64, stride=24))
    evaluator = Evaluator(model, tokenizer, source, batch_size=4)
    expected = sliding_reference(model, tokenizer, paths["lines"], 64, 24)
    assert evaluator.perplexity() == pytest.approx(expected, rel=1e-5)
    stream = len(tokenizer("\n\n".join(paths["lines"]))["input_ids"])
    assert evaluator.n_tokens == stream - 1 and evaluator.protocol.protocol == "sliding"


def test_max_tokens_and_max_windows_bound_what_is_scored(tmp_path):
    paths = write_all(tmp_path)
    tokenizer = byte_tokenizer()
    windows = eval_source(tokenizer, settings(paths["txt"], context=32, max_windows=3)).windows
    assert windows is not None and len(windows.rows) == 3
    bounded = eval_source(tokenizer, settings(paths["txt"], context=32, max_tokens=100))
    assert bounded.windows is not None and bounded.protocol is not None  # a dataset's source has both
    assert len(bounded.windows.rows) == 3 and bounded.protocol.tokens == 3 * 31
    with pytest.raises(UserError, match="fewer than one window"):
        eval_source(tokenizer, settings(paths["txt"], context=4096))


def test_calibration_windows_are_seeded_slices_of_the_train_stream(tmp_path):
    paths = write_all(tmp_path)
    tokenizer = byte_tokenizer()
    blocks, source = calibration_blocks(tokenizer, paths["jsonl"], "text", 16, 5, seed=3)
    again, _ = calibration_blocks(tokenizer, paths["jsonl"], "text", 16, 5, seed=3)
    other, _ = calibration_blocks(tokenizer, paths["jsonl"], "text", 16, 5, seed=4)
    assert blocks.shape == (5, 16) and torch.equal(blocks, again) and not torch.equal(blocks, other)
    stream = tokenizer("\n\n".join(paths["lines"]), add_special_tokens=False)["input_ids"]
    text = "," + ",".join(map(str, stream)) + ","
    assert all("," + ",".join(map(str, row.tolist())) + "," in text for row in blocks)
    assert "5 random windows" in source


def test_comparable_says_what_differs():
    from engine.data.eval_data import EvalProtocol

    a = EvalProtocol(dataset="wikitext", config="wikitext-2-raw-v1", split="test", revision="b08601e",
                     text_column="text", protocol="papers", context=2048, stride=None, windows=140, tokens=286580)
    assert comparable(a, a) is None
    b = EvalProtocol(**{**a.__dict__, "context": 4096, "windows": 70, "tokens": 286650})
    line, missing = comparable(a, b), comparable(a, None)
    assert line is not None and missing is not None
    assert "context 2048 vs 4096" in line and "tokens" in line and "\n" not in line
    assert "records no evaluation protocol" in missing


# --- settings and the command line ----------------------------------------------------------------


@pytest.mark.parametrize("argv, fragment", [
    (["--stride", "8"], "--stride, --max-windows and --max-tokens need --eval-dataset"),
    (["--eval-dataset", "DATA", "--context", "64", "--stride", "64"], "--stride 64 must be below --context 64"),
    (["--eval-dataset", "DATA", "--eval-file", "DATA"], "not both"),
    (["--eval-dataset", "a:b:c:d"], "NAME[:CONFIG][:SPLIT]"),
])
def test_bad_protocol_flags_are_one_line(argv, fragment, tmp_path, tiny_folder, capsys):
    data = write_all(tmp_path)["txt"]
    argv = [a.replace("DATA", data) for a in argv]
    capsys.readouterr()
    assert main(["run", "ablation", "--model", str(tiny_folder), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0]


@pytest.mark.slow
def test_run_ablation_on_a_dataset_records_its_protocol(tmp_path, tiny_folder, capsys):
    """`run ablation --eval-dataset PATH --context N`: the baseline is the papers' loop's perplexity,
    the bootstrap resamples windows, and the result says how it was measured."""
    paths = write_all(tmp_path)
    out = tmp_path / "map.json"
    code = main(["run", "ablation", "--model", str(tiny_folder), "--eval-dataset", paths["parquet"],
                 "--context", "48", "--bootstrap", "50", "--json", str(out)])
    assert code == 0
    doc = AblationMap.from_json(json.loads(out.read_text()))
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_folder).eval()
    assert doc.baseline_ppl == pytest.approx(papers_reference(model, byte_tokenizer(), paths["lines"], 48), rel=1e-5)
    assert doc.protocol.protocol == "papers" and doc.protocol.context == 48 and doc.protocol.dataset == paths["parquet"]
    assert doc.eval_texts == doc.protocol.windows and doc.eval_tokens == doc.protocol.tokens == 47 * doc.eval_texts
    assert all(row.ci_low is not None and row.ci_high is not None and row.degradation_pct is not None
               and row.ci_low <= row.degradation_pct <= row.ci_high for row in doc.layers)
    assert "papers' protocol" in capsys.readouterr().out


@pytest.mark.slow
def test_prune_says_when_the_sessions_map_was_measured_another_way(tmp_path):
    """The map criterion reads the session's ablation map: a map measured by another protocol
    (here the built-in sentences, against a dataset's windows) is used, with a warning naming what
    differs."""
    from engine.core.events import Message
    from engine.experiments.prune.vocabulary import PruneSettings
    from engine.models.loading import LoadedModel
    from engine.registry import RunContext, experiment

    paths = write_all(tmp_path)
    model, tokenizer = tiny_model(), byte_tokenizer()
    doc = {**run_ablation_doc(model, tokenizer), "model": "tiny"}
    ablation = AblationMap.from_json(doc)
    settings = PruneSettings(method="map", remove=(1,), bootstrap=0, eval_dataset=paths["txt"], context=64)
    context = RunContext(model=LoadedModel(model, tokenizer, "tiny", "test", "cpu", "float32", "llama", 4),
                         inputs={"ablation": doc})
    events = list(experiment("prune").run(settings, context))
    warnings = [e.text for e in events if isinstance(e, Message) and e.level == "warning"]
    assert any("perplexities not comparable" in w and "protocol 'texts' vs 'papers'" in w for w in warnings)
    assert isinstance(events[-1], Result)
    assert ablation.protocol.protocol == "texts" and events[-1].data["protocol"]["protocol"] == "papers"


def run_ablation_doc(model, tokenizer) -> dict:
    from engine.experiments.ablation.run import run_ablation

    result = list(run_ablation(model, tokenizer, AblationSettings(eval_set="paper", max_length=32)))[-1]
    assert isinstance(result, Result)
    return result.data


# --- long windows: the prefix cache in host memory --------------------------------------------------


def test_the_prefix_cache_goes_to_the_host_when_only_it_does_not_fit():
    from engine.models.memory import MemoryPlan, place_prefix_cache

    plan = MemoryPlan("cuda:0", "float16", weights=10, prefix_cache=50, activations=5, logits=5)
    moved = place_prefix_cache(plan, free_bytes=30, host_free=100)
    assert (moved.prefix_cache, moved.host_cache, moved.total) == (0, 50, 20)
    assert "prefix cache 0.00 GB in host memory" in moved.line()
    assert place_prefix_cache(plan, free_bytes=100, host_free=100) == plan  # it fits beside the model
    assert place_prefix_cache(plan, free_bytes=15, host_free=100) == plan  # the rest alone does not fit
    assert place_prefix_cache(plan, free_bytes=30, host_free=40) == plan  # nor does the host hold it
    assert place_prefix_cache(MemoryPlan("cpu", "float32", 10, 50, 5, 5), 30, 100).prefix_cache == 50


@pytest.mark.slow
def test_a_host_prefix_cache_goes_back_to_the_gpu(monkeypatch, tmp_path):
    """On a model on one (virtual) GPU, a cache kept on the host is copied back to the device of
    the layer it feeds (the harness raises on a tensor of the wrong device, as CUDA does), and
    gives the numbers of a cache on the GPU."""
    from virtual_devices import device_of, two_gpus

    paths = write_all(tmp_path)
    tokenizer = byte_tokenizer()
    source = eval_source(tokenizer, settings(paths["txt"], context=48))
    plain = Evaluator(tiny_model(seed=3), tokenizer, source, batch_size=4)
    plain.build_cache()
    expected = [plain.perplexity(start) for start in range(4)]
    with two_gpus(monkeypatch):
        model = tiny_model(seed=3).to("cuda:0")
        evaluator = Evaluator(model, tokenizer, source, batch_size=4, cache_on_host=True)
        evaluator.build_cache()
        assert evaluator._layer_inputs is not None  # build_cache made them
        assert all((device_of(t) or torch.device("cpu")).type == "cpu" for t in evaluator._layer_inputs[0])
        got = [evaluator.perplexity(start) for start in range(4)]
    assert got == pytest.approx(expected, rel=1e-6)


def test_the_auto_batch_keeps_the_cache_beside_the_model_while_any_batch_allows(monkeypatch):
    """2048-token windows of a SmolLM2-sized model: with room for the cache, the auto batch keeps it
    on the GPU; with room for the model and one window's forward but not the cache, it plans the
    cache on the host and the largest batch that then fits."""
    from engine.models import memory
    from engine.models.memory import ModelShape, auto_eval_batch, plan_memory

    monkeypatch.setattr(memory, "free_memory", lambda device: 10**12)  # the host's RAM
    shape = ModelShape(params=134_515_008, n_layers=30, hidden=576, intermediate=1536, heads=9, vocab=49152)
    windows = [2048] * 100
    roomy = int(plan_memory(shape, "float16", "cuda:0", windows, 4).total / memory.MARGIN) + 1
    assert auto_eval_batch("cuda:0", shape, "float16", windows, roomy) >= 4
    assert memory.place_prefix_cache(plan_memory(shape, "float16", "cuda:0", windows, 4), roomy).host_cache == 0
    tight = int(plan_memory(shape, "float16", "cuda:0", windows, 2, prefix_cache=False).total / memory.MARGIN) + 1
    chosen = auto_eval_batch("cuda:0", shape, "float16", windows, tight)
    plan = memory.place_prefix_cache(plan_memory(shape, "float16", "cuda:0", windows, chosen), tight)
    assert chosen == 2 and plan.host_cache == 30 * 576 * 2 * 2048 * 100 and plan.total <= memory.MARGIN * tight


@pytest.mark.slow
def test_recovery_trains_on_calibration_windows_and_records_both_texts(tmp_path, tiny_folder):
    paths = write_all(tmp_path)
    out = tmp_path / "recovery.json"
    code = main(["run", "recovery", "--model", str(tiny_folder), "--layers", "1", "--steps", "2",
                 "--calib-dataset", paths["jsonl"], "--block-size", "16", "--train-blocks", "4", "--batch-size", "2",
                 "--calib-seed", "5", "--eval-dataset", paths["txt"], "--context", "48", "--json", str(out)])
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["train_source"].startswith(paths["jsonl"]) and "4 random windows" in doc["train_source"]
    assert doc["train_blocks"] == 4 and doc["settings"]["calib_seed"] == 5
    assert doc["protocol"]["protocol"] == "papers" and doc["protocol"]["context"] == 48
