"""The model card of an exported folder, by the Hub's conventions: `huggingface_hub.ModelCard`
with YAML metadata a program reads back (`ModelCard.load(folder / "README.md").data`).

The metadata carries the Hub's own keys (`base_model`, `library_name`, `pipeline_tag`, `tags`,
`model-index` with the perplexity measured and lm-eval's accuracies) and one `anatomy_tui` block saying what was done to
the model: for a prune, the removed layers (0-based indices of the original), the criterion, the
healing, every perplexity with its evaluation protocol, and lm-eval's accuracies where the run
measured them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.disk.atomic import atomic_write_bytes
from engine.models.sources import DEFAULT_MODEL

if TYPE_CHECKING:  # huggingface_hub's Hub client takes 0.8 s to import: not on the console's way to its first paint
    from huggingface_hub import EvalResult, ModelCard

CARD = "README.md"
METADATA_KEY = "anatomy_tui"  # the card's block of what anatomy-tui did to the model
# The embedded model is the Q4_1 GGUF of this Hub model, dequantized.
EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def hub_id(name: str, source: str) -> str | None:
    """The Hub repository a loaded model came from (its name and where it loaded from, as
    `LoadedModel` records them: only a Hub model's are the same id), or None for a local folder
    or GGUF file."""
    if name == DEFAULT_MODEL:
        return EMBEDDED_HUB_ID
    return name if name == source and name.count("/") == 1 else None


@dataclass(frozen=True)
class Perplexity:
    """The exported model's perplexity as it enters `model-index`: on which texts, by which protocol."""

    value: float
    texts: str  # the dataset or text set it was measured on (a Hub dataset id, a file name, a built-in set)
    protocol: Mapping[str, Any] | None = None  # the result's `protocol` where the run recorded one

    def eval_result(self) -> EvalResult:
        from huggingface_hub import EvalResult

        protocol = dict(self.protocol or {})
        return EvalResult(
            task_type="text-generation", task_name="perplexity",
            dataset_type=str(protocol.get("dataset") or self.texts), dataset_name=str(self.texts),
            dataset_config=protocol.get("config"), dataset_split=protocol.get("split"),
            dataset_revision=protocol.get("revision"),
            dataset_args={k: v for k, v in protocol.items() if k not in ("dataset", "config", "split", "revision")}
            or None,
            metric_type="perplexity", metric_name="perplexity", metric_value=float(self.value),
        )


@dataclass(frozen=True)
class CardFacts:
    """Everything a card says: the title and body for people, the metadata for programs."""

    title: str
    body: str  # Markdown paragraphs under the title
    details: Mapping[str, Any]  # the `anatomy_tui` block (JSON-like values only)
    base_model: str | None = None  # a Hub id, or None when the model was local
    tags: Sequence[str] = ()
    perplexity: Perplexity | None = None
    library: str = "transformers"  # "peft" for a folder holding only an adapter
    accuracy: Sequence[Mapping[str, Any]] = ()  # lm-eval's scores of this model (events.TaskScore documents)
    n_shot: Mapping[str, int] | None = None  # as lm-eval ran each task (the evaluation's protocol)

    def eval_results(self) -> list[EvalResult] | None:
        """`model-index`: the perplexity, then each lm-eval task's accuracy (and length-normalised)."""
        found = [self.perplexity.eval_result()] if self.perplexity is not None else []
        return found + accuracy_results(self.accuracy, self.n_shot) or None


LM_EVAL_METRICS = ("acc", "acc_norm", "exact_match")  # exact_match: a generative task (exact_facts)


def accuracy_results(scores: Sequence[Mapping[str, Any]], n_shot: Mapping[str, int] | None) -> list[EvalResult]:
    """lm-eval's scores (events.TaskScore documents) as `model-index` entries, one per task and metric."""
    from huggingface_hub import EvalResult

    found = []
    for score in scores:
        task = str(score["task"])
        shots = (n_shot or {}).get(task)
        for metric in LM_EVAL_METRICS:
            if score.get(metric) is not None:
                found.append(EvalResult(
                    task_type="text-generation", dataset_type=task, dataset_name=task,
                    dataset_args={"num_few_shot": shots} if shots is not None else None,
                    metric_type=metric, metric_name=f"{metric} (lm-eval)", metric_value=float(score[metric])))
    return found


def add_accuracy(folder: Path, scores: Sequence[Mapping[str, Any]], protocol: Mapping[str, Any] | None,
                 source: str) -> None:
    """Puts lm-eval's scores of an exported model (measured after the export: `source` says where)
    into its folder's card, in place of any it had: `model-index` entries and `lm_eval` in the
    `anatomy_tui` block. The card is rewritten atomically."""
    from huggingface_hub import ModelCard

    path = Path(folder) / CARD
    card = ModelCard.load(path)
    data = card.data
    kept = [r for r in data.eval_results or [] if r.metric_type not in LM_EVAL_METRICS]
    data.eval_results = kept + accuracy_results(scores, (protocol or {}).get("n_shot")) or None
    data.model_name = data.model_name or path.parent.name
    block = dict(data.get(METADATA_KEY) or {})
    block["lm_eval"] = {"source": source, "protocol": dict(protocol or {}) or None, "scores": list(scores)}
    data[METADATA_KEY] = block
    atomic_write_bytes(path, str(card).encode("utf-8"), "model card")


def model_card(facts: CardFacts) -> ModelCard:
    from huggingface_hub import ModelCard, ModelCardData

    metadata: dict[str, Any] = {METADATA_KEY: dict(facts.details)}  # ours, beside the card's own keys
    data = ModelCardData(
        base_model=facts.base_model,
        library_name=facts.library,
        pipeline_tag="text-generation",
        tags=["anatomy-tui", *facts.tags],
        model_name=facts.title,
        eval_results=facts.eval_results(),
        **metadata,
    )
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n# {facts.title}\n\n{facts.body.strip()}\n")
