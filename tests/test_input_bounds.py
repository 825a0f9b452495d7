"""Trust nothing, part two (issue 27) and issue 31: what a run reads is bounded, and every bad input
is one line (exit 2, no traceback), before the model loads.

- Reading: --max-tokens and --max-windows read only the text they need (a file is read a chunk at a
  time, the text tokenized a chunk at a time); text over the 64 MB budget without a bound is refused
  before it is read. Measured: the peak memory of a process reading a 200 MB one-line file does not
  grow with the file.
- Devices: names other than auto, cpu, cuda, cuda:N are refused with the settings, and a GPU the
  machine lacks before any model file is read.
- Numbers: every integer setting has a ceiling (its own, or MAX_INT), and the error names it.
- Files: an empty parquet, a file name too long, a folder, a file that cannot be read.
- `run evaluate`'s printout: no perplexity-protocol line made of Nones.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from tiny_models import byte_tokenizer

import engine.data.dataset_texts
import engine.data.eval_data
import engine.data.text
import engine.models.loading
import engine.models.memory
from cli.main import main
from engine.core.errors import UserError
from engine.core.files import TEXT_BUDGET, read_lines, short_path
from engine.core.settings import MAX_INT, MAX_WINDOW
from engine.data.dataset_texts import load_texts
from engine.data.eval_data import describe, eval_source
from engine.data.text import token_ids
from engine.experiments.ablation.vocabulary import AblationSettings
from engine.registry import EXPERIMENTS
from sessions.store import SessionStore

ROOT = Path(__file__).resolve().parent.parent
PAPER = ["--eval-set", "paper"]
LONG_NAME = "x" * 300  # issue 31: `"$(printf 'x%.0s' {1..300})"`
MB = 2**20


@pytest.fixture(autouse=True)
def _fresh_cache():
    load_texts.cache_clear()
    yield
    load_texts.cache_clear()


@pytest.fixture
def no_load(monkeypatch):
    """Neither the model's config nor its weights may be read: any call fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model file was read")

    monkeypatch.setattr(engine.models.loading, "load_model", refuse)
    monkeypatch.setattr(engine.models.memory, "preview_model", refuse)


def refused(argv: list[str], capsys) -> str:
    """The one error line of a run that exits 2, with nothing else on stderr and no session made."""
    capsys.readouterr()
    assert main([*argv, "--session", "s"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("anatomy-tui: error: "), err
    assert not SessionStore().home.exists() or not any(SessionStore().home.iterdir())
    return err[0]


def cli(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`anatomy-tui ARGV` as its own process (the installed entry point's module), this tree's code."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    return subprocess.run([sys.executable, "-m", "cli.main", *argv], capture_output=True, text=True, env=env,
                          cwd=cwd or ROOT, timeout=600)


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(err) == 1 and "Traceback" not in done.stderr, (done.returncode, err)
    assert err[0].startswith("anatomy-tui: error: ")
    return err[0]


def one_line_file(path: Path, size: int) -> None:
    """A file of `size` bytes of text on one line (words, no line break), written a MB at a time."""
    block = ("the mill on the river turns in every season and grinds flour for the town " * 15000)[:MB]
    with path.open("w", encoding="utf-8") as handle:
        for _ in range(size // MB):
            handle.write(block)


# --- the probes, each as its own process: one line, exit 2, no traceback ---------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("argv", "message"), [
    (["ablation", "--device", "tpu"],
     "--device tpu: must be auto, cpu, cuda or cuda:N (N = 0, 1, ...) (default auto)"),
    (["ablation", "--device", "cuda:-1"],
     "--device cuda:-1: must be auto, cpu, cuda or cuda:N (N = 0, 1, ...) (default auto)"),
    (["ablation", "--max-length", "99999999999999999999"],
     "--max-length 99999999999999999999: must be an integer at least 2 and at most 1048576 (default 256); "
     "one window's attention scores take tokens^2 x 6 bytes a head"),
    (["recovery", "--block-size", "99999999999"],
     "--block-size 99999999999: must be an integer at least 2 and at most 1048576 (default 128)"),
    (["recovery", "--repeats", "100000000000"],
     "--repeats 100000000000: must be an integer at least 1 and at most 1000 (default 1); each repeat is"),
    (["weights", "--eval-file", LONG_NAME],
     f"evaluation file {'x' * 40}...{'x' * 20} (300 characters): File name too long"),
], ids=["tpu", "cuda:-1", "max-length", "block-size", "repeats", "long file name"])
def test_the_probes_are_one_line_in_their_own_process(argv, message, tmp_path):
    """On the embedded model (the default): each is refused before its GGUF is read (a second,
    not the two minutes of a dequantization)."""
    line = one_line(cli("run", *argv, *PAPER, cwd=tmp_path))
    assert message in line, line


@pytest.mark.slow
def test_an_empty_parquet_is_one_line_in_its_own_process(tmp_path, tiny_folder):
    import pyarrow as pa
    import pyarrow.parquet as pq

    no_rows = tmp_path / "no-rows.parquet"
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), no_rows)  # was DatasetGenerationError
    line = one_line(cli("run", "ablation", "--model", str(tiny_folder), "--eval-dataset", str(no_rows)))
    assert line.endswith(f"dataset {no_rows} holds no rows (an empty parquet file); give a file of text rows")


# --- devices: before any model file is read --------------------------------------------------------


@pytest.mark.parametrize("device", ["tpu", "cuda:-1", "garbage", "cuda:", "cuda:1x", "CPU", "cuda:0,cuda:1"])
def test_device_names_are_refused_with_the_settings(device, no_load, capsys):
    line = refused(["run", "ablation", "--device", device, *PAPER], capsys)
    assert "must be auto, cpu, cuda or cuda:N (N = 0, 1, ...)" in line


def test_a_job_file_with_a_bad_device_is_refused_too():
    from engine.models.options import ModelOptions

    with pytest.raises(UserError, match="--device tpu: must be auto, cpu, cuda or cuda:N"):
        ModelOptions.from_dict({"device": "tpu"})
    growth = next(entry for entry in EXPERIMENTS if entry.name == "growth").settings_class
    with pytest.raises(UserError, match="--device cuda:-1: must be"):
        growth.from_dict({"device": "cuda:-1"})


def test_a_gpu_the_machine_lacks_is_refused_before_any_model_file(monkeypatch, no_load, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0: (8, 0))  # read with the count
    line = refused(["run", "ablation", "--device", "cuda:2", *PAPER], capsys)
    assert line.endswith("--device cuda:2: only 2 GPU(s); pick another index")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    line = refused(["run", "ablation", "--device", "cuda", *PAPER], capsys)
    assert line.endswith("--device cuda: no CUDA GPU is visible here; use --device cpu")
    line = refused(["run", "growth", "--device", "cuda:0"], capsys)  # a device of growth's own
    assert line.endswith("--device cuda:0: no CUDA GPU is visible here; use --device cpu")


# --- numbers: a ceiling on every integer, named in the error -----------------------------------------


def test_every_integer_setting_has_a_ceiling():
    """Registry-driven: every integer field of every experiment refuses MAX_INT + 1 (its own
    `high`, or the ceiling every integer field has), so no count reaches an OverflowError."""
    from engine.models.options import ModelOptions

    unbounded = []
    for cls in [entry.settings_class for entry in EXPERIMENTS] + [ModelOptions]:
        for spec in cls.fields():
            if spec.base is not int:
                continue
            try:
                spec.coerce((MAX_INT + 1,) if spec.is_tuple else MAX_INT + 1)
            except UserError as exc:
                assert "at most" in str(exc), str(exc)
            else:
                unbounded.append(f"{cls.__name__}.{spec.name}")
    assert not unbounded, unbounded


@pytest.mark.parametrize(("argv", "words"), [
    (["ablation", "--max-length", "99999999999999999999"], "at most 1048576"),
    (["ablation", "--max-length", str(MAX_WINDOW + 1)], "at most 1048576"),
    (["ablation", "--context", str(10**12)], "at most 1048576"),
    (["ablation", "--stride", str(10**12)], "at most 1048576"),
    (["ablation", "--max-windows", str(10**12)], f"at most {TEXT_BUDGET}"),
    (["ablation", "--max-tokens", str(10**12)], f"at most {TEXT_BUDGET}"),
    (["ablation", "--eval-batch-size", str(10**12)], f"at most {MAX_INT}"),
    (["ablation", "--bootstrap", str(10**12)], f"at most {MAX_INT}"),
    (["recovery", "--block-size", "99999999999"], "at most 1048576"),
    (["recovery", "--train-blocks", str(10**12)], f"at most {MAX_INT}"),
    (["recovery", "--steps", str(10**12)], f"at most {MAX_INT}"),
    (["recovery", "--repeats", "100000000000"], "at most 1000"),
    (["prune", "--heal-steps", str(10**12)], f"at most {MAX_INT}"),
    (["dynamics", "--max-length", str(10**12)], "at most 1048576"),
    (["growth", "--seq-len", str(10**12)], "at most 1048576"),
    (["growth", "--hidden-size", str(10**12)], f"at most {MAX_INT}"),
])
def test_numbers_past_their_ceiling_are_one_line_before_the_load(argv, words, no_load, capsys):
    fields = {spec.name for spec in next(e for e in EXPERIMENTS if e.name == argv[0]).settings_class.fields()}
    line = refused(["run", *argv, *(PAPER if "eval_set" in fields else [])], capsys)
    assert f"{argv[1]} {argv[2][:24]}" in line and words in line, line


# --- files ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["--eval-file", "--train-file", "--eval-dataset", "--calib-dataset"])
def test_a_file_name_too_long_is_one_line(flag, no_load, capsys):
    line = refused(["run", "recovery", flag, LONG_NAME, *(PAPER if flag != "--eval-file" else [])], capsys)
    assert "File name too long" in line and "(300 characters)" in line and "x" * 41 not in line, line


@pytest.mark.parametrize("argv", [
    ["ablation", "--model", LONG_NAME], ["ablation", "--json", LONG_NAME], ["evaluate", "--tasks", "piqa", "--folder",
    LONG_NAME], ["evaluate", "--tasks", "piqa", "--adapter", LONG_NAME], ["scaling-fit", "--csv", LONG_NAME],
    ["growth", "--phases", LONG_NAME], ["dynamics", "--text-file", LONG_NAME], ["prune", "--export", LONG_NAME],
    ["growth", "--train-file", LONG_NAME],
], ids=lambda argv: " ".join(argv[:-1]))
def test_a_name_too_long_in_any_path_flag_is_one_line(argv, monkeypatch, capsys):
    """Issue 31 on every flag that names a file or folder: wherever a check first touches the path."""
    monkeypatch.setattr(engine.models.loading, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    line = refused(["run", *argv], capsys)
    assert "File name too long" in line and "x" * 300 not in line or "phase table" in line, line


def test_a_folder_or_an_unreadable_file_is_one_line(tmp_path, monkeypatch, no_load, capsys):
    line = refused(["run", "ablation", "--eval-file", str(tmp_path)], capsys)
    assert line.endswith(f"evaluation file {tmp_path} is a folder; give a UTF-8 text file, one text per line")
    locked = tmp_path / "locked.txt"
    locked.write_text("a text\n")
    locked.chmod(0)
    if os.access(locked, os.R_OK):  # root reads it anyway: the error the kernel gives anyone else
        def denied(self, *args, **kwargs):
            raise PermissionError(13, "Permission denied", str(self))

        monkeypatch.setattr(Path, "read_text", denied)
        monkeypatch.setattr(Path, "open", denied)
    line = refused(["run", "ablation", "--eval-file", str(locked)], capsys)
    assert line.endswith(f"evaluation file {short_path(locked)}: Permission denied")  # long paths are shortened
    line = refused(["run", "ablation", "--eval-dataset", str(locked)], capsys)
    assert "dataset file /" in line and line.endswith("locked.txt: Permission denied")


@pytest.mark.parametrize(("argv", "message"), [
    (["--eval-file", "/dev/zero"], "evaluation file /dev/zero is not a regular file (a device or a pipe)"),
    (["--eval-dataset", "/dev/null"], "dataset /dev/null: not a regular file or folder (a device or a pipe)"),
    (["--eval-dataset", "~nosuchuser/data.txt"], "dataset '~nosuchuser/data.txt': no such file or folder"),
], ids=["a device as a file", "a device as a dataset", "an unknown user's home"])
def test_paths_that_are_no_file_are_one_line(argv, message, no_load, capsys):
    if not Path(argv[1]).exists() and argv[1].startswith("/dev/"):
        pytest.skip(f"no {argv[1]} here")
    assert message in refused(["run", "ablation", *argv], capsys)


@pytest.mark.parametrize("kind", ["no rows", "no bytes", "no columns", "a folder of one empty file"])
def test_an_empty_parquet_is_one_line(kind, tmp_path, tiny_folder, no_load, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "data.parquet"
    if kind == "no rows":
        pq.write_table(pa.table({"text": pa.array([], pa.string())}), path)
    elif kind == "no columns":
        pq.write_table(pa.table({}), path)
    else:
        path.write_bytes(b"")
    if kind.startswith("a folder"):
        folder = tmp_path / "data"
        folder.mkdir()
        path.rename(folder / "test-00000.parquet")
        path = folder
    line = refused(["run", "ablation", "--eval-dataset", str(path)], capsys)
    assert f"dataset {path}" in line and ("holds no rows" in line or "could not be read" in line), line


# --- reading bounded ----------------------------------------------------------------------------


def test_a_source_over_the_budget_is_refused_before_it_is_read(tmp_path, monkeypatch, no_load, capsys):
    """A sparse file of 65 MB: refused by its size (reading it would find NUL bytes)."""
    big = tmp_path / "big.txt"
    with big.open("wb") as handle:
        handle.truncate(TEXT_BUDGET + MB)

    def no_reading(*args, **kwargs):
        raise AssertionError("the file was read")

    monkeypatch.setattr(engine.data.dataset_texts, "_text_lines", no_reading)
    monkeypatch.setattr(Path, "read_text", no_reading)
    line = refused(["run", "ablation", "--eval-dataset", str(big)], capsys)
    assert line.endswith(f"dataset {big} is 65 MB of text, over the 64 MB a run reads without a bound: give a "
                         "smaller file, or with --eval-dataset --max-tokens N or --max-windows N (only its "
                         "beginning is read)")
    line = refused(["run", "recovery", "--calib-dataset", str(big), *PAPER], capsys)
    assert line.endswith("is 65 MB of text, over the 64 MB a run reads without a bound: give a smaller file, or "
                         "with --eval-dataset --max-tokens N or --max-windows N (only its beginning is read)")
    line = refused(["run", "ablation", "--eval-file", str(big)], capsys)
    assert line.endswith("is 65 MB, over the 64 MB a run reads whole; give a smaller file, or score its "
                         "beginning: --eval-dataset FILE --max-tokens N")
    line = refused(["run", "recovery", "--train-file", str(big), *PAPER], capsys)
    assert line.endswith("is 65 MB, over the 64 MB a run reads whole; give a smaller file")
    with pytest.raises(UserError, match="over the 64 MB"):
        read_lines(big, "text file")


def test_a_dataset_read_through_datasets_stops_at_the_budget(monkeypatch):
    import datasets

    monkeypatch.setattr(engine.data.dataset_texts, "TEXT_BUDGET", 1000)
    monkeypatch.setattr(datasets, "load_dataset",
                        lambda *args, **kwargs: datasets.Dataset.from_dict({"text": ["a row of text"] * 200}))
    with pytest.raises(UserError, match=r"holds more than 64 MB of text, over the 64 MB a run reads without"):
        load_texts("someone/big", "test", "text")


def test_bounds_read_only_the_beginning_of_a_one_line_file(tmp_path):
    path = tmp_path / "one-line.txt"
    one_line_file(path, 8 * MB)
    settings = AblationSettings(eval_dataset=str(path), context=64, max_windows=2)
    source = eval_source(byte_tokenizer(), settings)
    assert source.windows is not None and source.protocol is not None  # a dataset's source has both
    assert len(source.windows.rows) == 2 and source.protocol.tokens == 2 * 63
    (loaded,) = [load_texts(str(path), "test", "text", engine.data.eval_data.stream_chars(settings))]
    assert not loaded.complete and sum(map(len, loaded.texts)) == engine.data.eval_data.stream_chars(settings) == 6144
    assert engine.data.eval_data.wanted_tokens(settings) == 128
    with path.open(encoding="utf-8") as handle:
        head = handle.read(200)
    expected = byte_tokenizer()(head)["input_ids"]
    assert source.windows.rows[0] == tuple(expected[:64]) and source.windows.rows[1] == tuple(expected[64:128])


def test_the_bounded_windows_equal_the_whole_texts_windows(tmp_path):
    """--max-windows and --max-tokens give exactly the first windows of the whole text's stream,
    papers' and sliding, on a text of many lines."""
    from engine.data.eval_data import cut_windows

    lines = [f"line {i}: the river turns the mill, and the mill grinds the grain ({i * 7 % 13})" for i in range(3000)]
    path = tmp_path / "lines.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tokenizer = byte_tokenizer()
    whole = tokenizer("\n\n".join(lines))["input_ids"]
    bounds: list[dict[str, Any]] = [{"max_windows": 3}, {"max_tokens": 500}, {"max_windows": 4, "stride": 40},
                                    {"max_tokens": 300, "max_windows": 9}]  # settings fields
    for changes in bounds:
        settings = AblationSettings(eval_dataset=str(path), context=128, **changes)
        load_texts.cache_clear()
        bounded = eval_source(tokenizer, settings).windows
        ids = whole[: changes["max_tokens"]] if "max_tokens" in changes else whole
        assert bounded == cut_windows(ids, 128, changes.get("stride"), changes.get("max_windows")), changes


def test_a_bound_past_the_budget_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(engine.data.eval_data, "TEXT_BUDGET", 50_000)
    path = tmp_path / "lines.txt"
    path.write_text("word " * 40_000, encoding="utf-8")
    settings = AblationSettings(eval_dataset=str(path), context=64, max_tokens=60_000)
    with pytest.raises(UserError, match=r"its first 64 MB of text hold 50000 tokens, fewer than the 60000 "
                                        "--max-tokens/--max-windows ask for"):
        eval_source(byte_tokenizer(), settings)


TEXT = "\n\n".join(f"Paragraph {i}: the mill's wheel turned {i % 17} times, and   the river ran on.\n"
                   f"It's {i * 3} metres to the bridge; don't stop." for i in range(600))


def bpe_tokenizers(text: str = TEXT):
    """A GPT-2-like byte-level BPE trained on `text`, the same with a BOS/EOS template, and the byte
    tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.train_from_iterator([text], trainers.BpeTrainer(vocab_size=600, special_tokens=["<s>", "</s>"],
                                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bpe = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>")
    framed = Tokenizer.from_str(core.to_str())
    framed.post_processor = processors.TemplateProcessing(single="<s> $A </s>",
                                                          special_tokens=[("<s>", 0), ("</s>", 1)])
    with_ends = PreTrainedTokenizerFast(tokenizer_object=framed, bos_token="<s>", eos_token="</s>")
    return bpe, with_ends, byte_tokenizer()


def test_texts_cut_to_their_first_tokens_give_the_same_truncated_ids():
    """--eval-file's texts are cut to what their first --max-length tokens need (a 20 MB line is
    never tokenized whole): the ids the evaluator's truncation gives are unchanged."""
    from engine.data.text import clip_texts

    texts = [TEXT, TEXT.replace("\n", " "), "short text", "x" * 50_000, " " * 20_000 + "end"]
    for tokenizer in bpe_tokenizers():
        for max_length in (8, 256):
            clipped = clip_texts(tokenizer, texts, max_length)
            assert sum(map(len, clipped)) < sum(map(len, texts)) / 4 and clipped[2] == "short text"
            assert (tokenizer(list(clipped), truncation=True, max_length=max_length)["input_ids"]
                    == tokenizer(texts, truncation=True, max_length=max_length)["input_ids"])


def test_training_blocks_tokenize_only_the_text_they_take():
    """--train-file's pool: --train-blocks blocks of --block-size tokens, the same as cut from the
    whole text's ids, tokenized from the beginning that holds them."""
    import torch

    from engine.data.text import token_blocks

    for tokenizer in bpe_tokenizers():
        whole = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
        blocks = token_blocks(tokenizer, TEXT, 16, 5)
        assert torch.equal(blocks, torch.tensor(whole[:80]).view(5, 16))
        every = token_blocks(tokenizer, TEXT, 16)
        assert torch.equal(every, torch.tensor(whole[: len(whole) // 16 * 16]).view(-1, 16))


def test_text_tokenized_in_chunks_gives_the_whole_texts_ids(monkeypatch):
    """A GPT-2-like byte-level BPE (trained here on the text), a BOS/EOS template, and the byte
    tokenizer: ids in chunks of 2,000 characters are the ids of the whole text."""
    text = TEXT
    bpe, with_ends, _ = bpe_tokenizers()
    monkeypatch.setattr(engine.data.text, "TOKENIZE_CHUNK", 2000)
    assert len(text) > 20 * 2000
    for tokenizer in (bpe, with_ends, byte_tokenizer()):
        for special in (True, False):
            whole = tokenizer(text, add_special_tokens=special)["input_ids"]
            assert list(token_ids(tokenizer, text, add_special_tokens=special)) == whole
            assert list(token_ids(tokenizer, text, 777, special)) == whole[:777]
    assert with_ends(text)["input_ids"][0] == 0 and with_ends(text)["input_ids"][-1] == 1


PEAK = textwrap.dedent("""
    import json, sys
    sys.path[:0] = [{root!r}, {tests!r}]
    from tiny_models import byte_tokenizer
    from engine.core.errors import UserError
    from engine.data.eval_data import eval_source
    from engine.experiments.ablation.vocabulary import AblationSettings

    def rss(field):
        for line in open("/proc/self/status"):
            if line.startswith(field):
                return int(line.split()[1]) * 1024

    tokenizer = byte_tokenizer()
    for bound in json.loads(sys.argv[1]):
        with open("/proc/self/clear_refs", "w") as refs:  # the peak (VmHWM) starts again from what is resident now
            refs.write("5")
        before = rss("VmRSS:")
        settings, source = AblationSettings(**bound), None
        try:
            source = eval_source(tokenizer, settings)
            if source.windows is not None:
                said = f"{{len(source.windows.rows)}} windows"
            else:  # as the memory plan and the evaluator tokenize the texts
                lengths = [len(ids) for ids in tokenizer(list(source.texts), truncation=True,
                                                         max_length=256)["input_ids"]]
                said = f"{{len(lengths)}} texts of {{max(lengths)}} tokens"
        except UserError as exc:
            said = str(exc)
        del source
        print(json.dumps({{"before": before, "peak": rss("VmHWM:"), "said": said}}), flush=True)
""")


@pytest.mark.slow
@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="resets the peak through /proc")
def test_the_memory_of_a_bounded_read_does_not_grow_with_the_file(tmp_path):
    """The issue's probe: a 200 MB one-line file with --max-windows 2 reached 22.4 GB; --max-tokens
    1000 of a 20 MB file 3.2 GB. The peak (VmHWM) of one reading process over its memory before
    each read (the peak reset between reads, /proc/self/clear_refs): a few MB, where reading the
    file whole would take its size at least. The 20 MB line as an --eval-file too (a fast
    tokenizer's encoding of it, truncated, took 5 GB)."""
    sizes = {"200 MB": 200 * MB, "20 MB": 20 * MB}
    bounds, labels = [], []
    for label, size in sizes.items():
        path = tmp_path / f"{size // MB}.txt"
        one_line_file(path, size)
        assert path.stat().st_size == size
        cases = [{"max_windows": 2}, {"max_tokens": 1000}, *([{}] if size > TEXT_BUDGET else [])]
        for bound in [{"eval_dataset": str(path), "context": 500, **bound} for bound in cases] + [
                {"eval_file": str(path), "max_length": 256}] * (size < TEXT_BUDGET):
            bounds.append(bound)
            labels.append(label)
    script = tmp_path / "peak.py"
    script.write_text(PEAK.format(root=str(ROOT), tests=str(ROOT / "tests")))
    done = subprocess.run([sys.executable, str(script), json.dumps(bounds)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    grown = {}
    for label, bound, line in zip(labels, bounds, done.stdout.splitlines(), strict=True):
        found = json.loads(line)
        grown[(label, json.dumps(bound))] = found["peak"] - found["before"]
        shown = {k: v for k, v in bound.items() if k not in ("eval_dataset", "context")}
        print(f"{label} one-line file, {shown}: peak {found['peak'] / MB:.0f} MB, "
              f"{(found['peak'] - found['before']) / MB:.1f} MB over the {found['before'] / MB:.0f} MB "
              f"before the read; {found['said'][:90]}")
        if "eval_file" in bound:  # one text of 20 MB, cut to what its first 256 tokens need
            assert found["said"] == "1 texts of 256 tokens", found
        elif "max_windows" in bound or "max_tokens" in bound:
            assert found["said"] == "2 windows", found
        else:
            assert "over the 64 MB a run reads without a bound" in found["said"]
    bounded = {key: value for key, value in grown.items() if "eval_dataset" in key[1]}
    assert max(bounded.values()) < 32 * MB, {k: v / MB for k, v in grown.items()}
    whole_file = {key: value for key, value in grown.items() if "eval_file" in key[1]}  # read whole, never tokenized so
    assert whole_file and max(whole_file.values()) < 3 * 20 * MB, {k: v / MB for k, v in grown.items()}


@pytest.mark.slow
def test_a_whole_run_on_a_200_mb_file_stays_as_small_as_on_a_small_one(tmp_path, tiny_folder):
    """`run ablation --eval-dataset big.txt --max-windows 2` end to end, as its own process: its
    peak resident memory (the children's ru_maxrss) is that of the same run on a 1 MB file, within
    a few MB, far below the 200 MB it names."""
    import resource

    peaks = {}
    for size in (MB, 200 * MB):
        path = tmp_path / f"{size // MB}.txt"
        one_line_file(path, size)
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        done = cli("run", "ablation", "--model", str(tiny_folder), "--eval-dataset", str(path), "--context", "64",
                   "--max-windows", "2", "--method", "skip", "--session", f"s{size}", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        peaks[size] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
        assert peaks[size] >= before * 1024  # the largest child so far: the order makes it this run's
        path.unlink()
    print(f"run ablation --max-windows 2: peak RSS {peaks[MB] / MB:.0f} MB on a 1 MB file, "
          f"{peaks[200 * MB] / MB:.0f} MB on a 200 MB one-line file")
    assert peaks[200 * MB] - peaks[MB] < 32 * MB


# --- what `run` prints about the evaluation --------------------------------------------------------


def test_evaluate_prints_no_perplexity_protocol_line(capsys):
    from tui_fixtures import evaluate_doc

    from cli.printers import print_result

    print_result("evaluate", evaluate_doc())
    out = capsys.readouterr().out
    assert "evaluation:" not in out and "None" not in out and "lm-eval" in out


@pytest.mark.parametrize(("protocol", "line"), [
    ({"dataset": "builtin:paper", "config": None, "split": None, "revision": None, "text_column": None,
      "protocol": "texts", "context": 256, "stride": None, "windows": 10, "tokens": 420},
     "evaluation: builtin:paper; each text alone, up to 256 tokens; 10 texts, 420 scored tokens"),
    ({"dataset": "/data/eval.txt", "config": None, "split": None, "revision": None, "text_column": None,
      "protocol": "texts", "context": 64, "stride": None, "windows": 3, "tokens": 99},
     "evaluation: /data/eval.txt; each text alone, up to 64 tokens; 3 texts, 99 scored tokens"),
    ({"dataset": "wikitext", "config": "wikitext-2-raw-v1", "split": "test", "revision": "b08601e04326c79dfdd3",
      "text_column": "text", "protocol": "papers", "context": 2048, "stride": None, "windows": 140, "tokens": 286580},
     "evaluation: wikitext:wikitext-2-raw-v1:test @b08601e04326; the papers' protocol: non-overlapping windows "
     "of 2048 tokens; 140 windows, 286580 scored tokens"),
    ({"dataset": "/data/big.txt", "config": None, "split": None, "revision": None, "text_column": "text",
      "protocol": "sliding", "context": 64, "stride": 32, "windows": 2, "tokens": 95},
     "evaluation: /data/big.txt; sliding windows of 64 tokens, stride 32; 2 windows, 95 scored tokens"),
], ids=["built-in", "eval-file", "hub dataset", "sliding"])
def test_the_evaluation_line_of_every_text_source(protocol, line):
    assert describe(protocol) == line
