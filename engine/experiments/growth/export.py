"""A saved growth or uniform model, exported as a Hugging Face folder with its card
(`anatomy-tui export SESSION --model growth|uniform DIR`)."""

from __future__ import annotations

from pathlib import Path

from engine.core.errors import UserError
from engine.experiments.growth.architecture import load_growth_model
from engine.export.folder import save_model_folder
from engine.export.model_card import CardFacts, model_card


def export_growth(source: str | Path, folder: str | Path, force: bool = False) -> Path:
    """A saved growth or uniform model folder (growth experiment), saved again with a card. The
    uniform model is a plain Llama; the growth one needs `engine.experiments.growth.architecture`
    imported (its per-layer FFN widths are a config Llama lacks)."""
    source = Path(source)
    if not (source / "config.json").is_file():
        raise UserError(f"{source} is not a saved model folder; run growth in this session first")
    model, tokenizer = load_growth_model(source)
    growth = model.config.model_type == "growth_llama"
    load = "`AutoModelForCausalLM.from_pretrained(folder)`"
    how = f"`import engine.experiments.growth.architecture` (registers growth_llama), then {load}" if growth else load
    arm = "growth" if growth else "uniform"
    card = model_card(CardFacts(
        title=f"{arm} model from anatomy-tui", tags=["growth"],
        details={"experiment": "growth", "arm": arm, "num_hidden_layers": model.config.num_hidden_layers},
        body=f"Trained by the growth experiment ({model.config.num_hidden_layers} layers). The tokenizer is one "
             f"token per character (growth_tokenizer.json).\n\nLoad with {how}.",
    ))
    return save_model_folder(model, tokenizer, folder, card, force)
