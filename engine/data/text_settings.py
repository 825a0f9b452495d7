"""The settings every experiment that reads text shares: the evaluation texts (built-in sets, a
file, or a dataset by the papers' protocol) and the training pool (a file, the built-in corpus, or a
dataset's random windows). Each is read before a model loads, so a wrong name is one line first."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.core.errors import UserError
from engine.core.files import TEXT_BUDGET
from engine.core.settings import MAX_SEED, MAX_WINDOW, WINDOW_WHY, Settings, setting

BOUND_WHY = "a token is at least a character, and a run reads at most 64 MB of text"
EVAL_BATCH_HELP = ("evaluation texts per forward pass (auto: on a GPU the most that fit in its free memory, "
                   "up to all of them; 8 on the CPU)")


@dataclass(frozen=True)
class DatasetTextSettings(Settings):
    """The column a dataset's texts are in, shared by --eval-dataset and --calib-dataset."""

    text_column: str = setting("text", "the column of --eval-dataset/--calib-dataset that holds the text")


@dataclass(frozen=True)
class EvalTextSettings(DatasetTextSettings):
    """The evaluation-text group that every perplexity-measuring experiment shares: the built-in
    sets or --eval-file (each text scored alone), or --eval-dataset (windows by the papers' protocol
    or a sliding window, engine/data/eval_data.py)."""

    eval_set: str = setting("full", "built-in evaluation texts: full (48 sentences) or paper (a 10-sentence subset)",
                            choices=("full", "paper"))
    eval_file: str | None = setting(None, "UTF-8 file, one evaluation text per line (instead of --eval-set; at most "
                                     "64 MB)", file="evaluation file")
    eval_dataset: str | None = setting(
        None, "evaluate on a dataset by the papers' protocol: a Hugging Face dataset NAME[:CONFIG][:SPLIT] "
        "(split default test; e.g. wikitext:wikitext-2-raw-v1:test) or a local .txt (one text a line), .jsonl, "
        ".parquet file or folder of them; its texts joined with blank lines, tokenized once, cut into windows "
        "of --context tokens; over 64 MB of text only with --max-tokens or --max-windows, which read its beginning")
    context: int = setting(2048, "tokens per evaluation window with --eval-dataset", low=2, high=MAX_WINDOW,
                           why=WINDOW_WHY)
    stride: int | None = setting(None, "with --eval-dataset: a sliding window moving N tokens at a time, each window "
                                 "scoring only its new tokens (below --context; off: non-overlapping windows, the "
                                 "remainder dropped)", low=1, high=MAX_WINDOW, none_word="off", why=WINDOW_WHY)
    max_windows: int | None = setting(None, "with --eval-dataset: score the first N windows only (only the text "
                                      "they need is read)", low=1, high=TEXT_BUDGET, none_word="all",
                                      why=BOUND_WHY)
    max_tokens: int | None = setting(None, "with --eval-dataset: read the first N tokens only (only the text they "
                                     "need is read; a hub dataset is then streamed); without it or --max-windows, "
                                     "a source over 64 MB is refused", low=2, high=TEXT_BUDGET,
                                     none_word="all", why=BOUND_WHY)
    eval_batch_size: int | None = setting(None, EVAL_BATCH_HELP, low=1, none_word="auto", aliases=("--batch-size",),
                                          resume_free=True)
    max_length: int = setting(256, "tokens per evaluation text at most (--eval-set, --eval-file)", low=2,
                              high=MAX_WINDOW, why=WINDOW_WHY)

    def check_inputs(self) -> None:
        """The protocol's flags agree, and --eval-dataset is read now (a wrong name, a missing
        `datasets`, an unreachable hub: one line before the model loads)."""
        super().check_inputs()
        if self.eval_dataset is None:
            if (self.stride, self.max_windows, self.max_tokens) != (None, None, None):
                raise UserError("--stride, --max-windows and --max-tokens need --eval-dataset")
            return
        if self.eval_file is not None:
            raise UserError("give --eval-dataset or --eval-file, not both")
        if self.stride is not None and self.stride >= self.context:
            raise UserError(f"--stride {self.stride} must be below --context {self.context} "
                            "(leave it off for non-overlapping windows)")
        from engine.data.dataset_texts import load_texts
        from engine.data.eval_data import stream_chars

        load_texts(self.eval_dataset, "test", self.text_column, stream_chars(self))

    def eval_source(self, tokenizer: Any) -> Any:
        """What the run evaluates on, as an engine.data.eval_data.EvalSource: dataset windows, or texts."""
        from engine.data.eval_data import eval_source

        return eval_source(tokenizer, self)


@dataclass(frozen=True)
class TrainTextSettings(DatasetTextSettings):
    """The training-pool group that every experiment fine-tuning a loaded model on text shares
    (recovery, prune's healing): the text, cut into blocks, and how many blocks a step draws. The
    training file is read before the model loads, as the evaluation file is."""

    train_file: str | None = setting(None, "UTF-8 training text (default: built-in)", file="training file")
    calib_dataset: str | None = setting(
        None, "training/calibration text from a dataset (instead of --train-file): a Hugging Face dataset "
        "NAME[:CONFIG][:SPLIT] (split default train) or a local file or folder, as --eval-dataset; the pool is "
        "--train-blocks random windows of --block-size tokens (the usual: 128 x 2048), drawn with --calib-seed")
    calib_seed: int = setting(0, "seed of the random calibration windows of --calib-dataset", low=0, high=MAX_SEED)
    batch_size: int = setting(4, "training blocks per step", low=1)
    block_size: int = setting(128, "tokens per training block", low=2, high=MAX_WINDOW, why=WINDOW_WHY)
    train_blocks: int = setting(128, "training pool size in blocks, cycled in a seeded order", low=1)

    def check_inputs(self) -> None:
        super().check_inputs()
        if self.calib_dataset is None:
            return
        if self.train_file is not None:
            raise UserError("give --calib-dataset or --train-file, not both")
        from engine.data.dataset_texts import load_texts

        load_texts(self.calib_dataset, "train", self.text_column)

    def training_corpus(self) -> Any:
        """The training text (engine.data.text.Corpus): the file given, or the built-in corpus, split
        90/10 by paragraph."""
        from pathlib import Path

        from engine.data.text import corpus

        return corpus(Path(self.train_file) if self.train_file else None)

    def training_blocks(self, tokenizer: Any) -> tuple[Any, str]:
        """The training pool, a LongTensor [blocks, block_size], and its source: --calib-dataset's
        random windows, else the training corpus cut into consecutive blocks."""
        if self.calib_dataset is not None:
            from engine.data.eval_data import calibration_blocks

            return calibration_blocks(tokenizer, self.calib_dataset, self.text_column, self.block_size,
                                      self.train_blocks, self.calib_seed)
        from engine.data.text import token_blocks

        text = self.training_corpus()
        return token_blocks(tokenizer, text.train, self.block_size, self.train_blocks), text.source
