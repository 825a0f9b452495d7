"""Greedy generation one token at a time, for the prompt pane: a manual loop with the KV cache, so
the caller sees each piece of text as it appears and can stop between any two tokens."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


def stream_greedy(
    model: Any, tokenizer: Any, prompt: str, max_new_tokens: int, stop: Callable[[], bool] = lambda: False
) -> Iterator[str]:
    """Yields the new text after each generated token (decoded as a whole, so multi-byte characters
    come out whole); ends at the end-of-text token, after `max_new_tokens`, or when `stop()` is true."""
    import torch

    ids = list(tokenizer.encode(prompt)) or [0]
    device = next(model.parameters()).device
    eos = getattr(tokenizer, "eos_token_id", None)
    limit = getattr(model.config, "max_position_embeddings", None) or 1 << 30
    ids = ids[-max(1, limit - max_new_tokens) :]
    past = None
    step_input = torch.tensor([ids], device=device)
    new: list[int] = []
    shown = ""
    with torch.no_grad():
        for _ in range(max_new_tokens):
            if stop() or len(ids) + len(new) >= limit:
                return
            out = model(input_ids=step_input, cache=past, use_cache=True)
            past = out.cache
            token = int(out.logits[0, -1].argmax())
            if eos is not None and token == eos:
                return
            new.append(token)
            text = tokenizer.decode(new)
            if text.endswith("\ufffd"):  # half of a multi-byte character: wait for the rest
                step_input = torch.tensor([[token]], device=device)
                continue
            if text != shown:
                yield text[len(shown) :]
                shown = text
            step_input = torch.tensor([[token]], device=device)
