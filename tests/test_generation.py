"""The project's one greedy decoder: transformers' generate, streamed and stoppable."""

from __future__ import annotations

import torch
from tiny_models import tiny_model

from engine.evaluation.generation import generate_text


def reference_greedy(model, ids: list[int], n: int) -> list[int]:
    """The textbook loop: the whole sequence through the model, argmax, append; no cache."""
    out = list(ids)
    with torch.no_grad():
        for _ in range(n):
            out.append(int(model(torch.tensor([out])).logits[0, -1].argmax()))
    return out[len(ids) :]


def test_same_tokens_as_the_argmax_loop_and_the_pieces_add_up(tokenizer) -> None:
    for family in ("llama", "gpt2"):
        model = tiny_model(family)
        pieces: list[str] = []
        text = generate_text(model, tokenizer, "The layer", 24, on_text=pieces.append)
        expected = reference_greedy(model, tokenizer.encode("The layer"), 24)
        assert text == tokenizer.decode(expected), family
        assert "".join(pieces) == text and len(pieces) > 1


def test_the_stop_flag_halts_generation(tokenizer) -> None:
    model = tiny_model("llama")
    full = generate_text(model, tokenizer, "The layer", 40)
    forwards = []
    model.register_forward_hook(lambda *args: forwards.append(1))
    pieces: list[str] = []
    text = generate_text(model, tokenizer, "The layer", 40, stop=lambda: len(pieces) >= 3, on_text=pieces.append)
    assert text == "".join(pieces[:3]) and full.startswith(text) and len(text) < len(full)
    assert len(forwards) < 10  # generate stopped at the flag, not after 40 tokens
    assert generate_text(model, tokenizer, "The layer", 40, stop=lambda: True) == ""


def test_the_prompt_and_the_continuation_stay_within_the_context(tokenizer) -> None:
    model = tiny_model("llama")
    prompt = "abcdefghijklmnopqrst"  # 20 byte tokens
    text = generate_text(model, tokenizer, prompt, 30, context=12)
    kept = tokenizer.encode(prompt)[-11:]
    assert text == tokenizer.decode(reference_greedy(model, kept, 1))


def test_end_of_text_ends_the_continuation(tokenizer) -> None:
    model = tiny_model("llama")
    first = reference_greedy(model, tokenizer.encode("The layer"), 1)[0]
    model.generation_config.eos_token_id = first  # the very next token ends the text
    assert generate_text(model, tokenizer, "The layer", 10) == ""
