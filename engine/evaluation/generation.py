"""Greedy text generation: the one decoder of the project (the prompt pane, the manipulation
experiment's samples, the growth run's samples).

It is transformers' own `generate` (KV cache, every family's quirks handled there), greedy, with a
streamer that hands each new piece of text to a callback as it appears and a stopping criterion
bound to a stop flag, so a user can stop between any two tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from engine.data.text import text_bound


def _never() -> bool:
    return False


class _PieceStreamer(BaseStreamer):
    """Decodes the new tokens as a whole after each one and passes on what was added, holding back
    half a multi-byte character until the rest arrives. Tokens that come after `stop()` turned
    true, and end-of-text tokens, are left out."""

    def __init__(self, tokenizer: Any, eos: set[int], stop: Callable[[], bool], on_text: Callable[[str], Any]):
        self.tokenizer = tokenizer
        self.eos = eos
        self.stop = stop
        self.on_text = on_text
        self.prompt_seen = False
        self.tokens: list[int] = []
        self.text = ""

    def put(self, value: Any) -> None:
        if not self.prompt_seen:  # generate hands over the prompt first
            self.prompt_seen = True
            return
        if self.stop():
            return
        new = [int(t) for t in value.reshape(-1).tolist() if int(t) not in self.eos]
        if not new:
            return
        self.tokens += new
        text = self.tokenizer.decode(self.tokens)
        if not text.endswith("\ufffd"):
            self._show(text)

    def end(self) -> None:
        """Whatever was held back (a character that never completed) comes out at the end."""
        if self.tokens:
            self._show(self.tokenizer.decode(self.tokens))

    def _show(self, text: str) -> None:
        if text != self.text:
            piece, self.text = text[len(self.text) :], text
            self.on_text(piece)


class _StopFlag(StoppingCriteria):
    def __init__(self, stop: Callable[[], bool]) -> None:
        self.stop = stop

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        return torch.full((input_ids.shape[0],), self.stop(), dtype=torch.bool, device=input_ids.device)


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    found = getattr(model.generation_config, "eos_token_id", None)
    if found is None:
        found = getattr(tokenizer, "eos_token_id", None)
    if found is None:
        return set()
    return {int(found)} if isinstance(found, int) else {int(i) for i in found}


def generate_text(
    model: Any,
    tokenizer: Any,
    prompt: str,
    max_new_tokens: int,
    *,
    stop: Callable[[], bool] = _never,
    on_text: Callable[[str], Any] | None = None,
    context: int | None = None,
) -> str:
    """The greedy continuation of `prompt` (not included), at most `max_new_tokens` tokens, ended
    early by an end-of-text token or by `stop()` turning true. `on_text(piece)` sees the text as it
    grows (the pieces add up to the returned text). The prompt keeps its last `context - 1` tokens
    and the continuation stays within `context` (default: the model's position limit).
    `tokenizer` needs only encode and decode."""
    return _generate(model, tokenizer, prompt, max_new_tokens, stop, on_text, context).text


def greedy_tokens(model: Any, tokenizer: Any, prompt: str, max_new_tokens: int) -> list[int]:
    """The token ids of `generate_text`'s continuation (end-of-text tokens left out): what the
    generation check compares between two models."""
    return _generate(model, tokenizer, prompt, max_new_tokens, _never, None, None).tokens


def _generate(model: Any, tokenizer: Any, prompt: str, max_new_tokens: int, stop: Callable[[], bool],
              on_text: Callable[[str], Any] | None, context: int | None) -> _PieceStreamer:
    import torch

    eos = _eos_ids(model, tokenizer)
    streamer = _PieceStreamer(tokenizer, eos, stop, on_text or (lambda piece: None))
    if max_new_tokens <= 0 or stop():
        return streamer
    limit = context or getattr(model.config, "max_position_embeddings", None) or 1 << 30
    kept = max(1, limit - 1)  # the prompt's last tokens; its last characters only are tokenized
    ids = (list(tokenizer.encode(prompt[-text_bound(kept) :])) or [0])[-kept:]
    new_tokens = max(1, min(max_new_tokens, limit - len(ids)))

    pad = getattr(tokenizer, "pad_token_id", None)
    config = GenerationConfig(
        max_new_tokens=new_tokens,
        do_sample=False,
        eos_token_id=sorted(eos) or None,
        pad_token_id=pad if pad is not None else (min(eos) if eos else 0),
    )
    from engine.models.anatomy import execution_device

    # where the embedding runs: its weights are `meta` placeholders when accelerate offloads it
    input_ids = torch.tensor([ids], device=execution_device(model.get_input_embeddings()))
    with torch.no_grad():
        model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            generation_config=config,
            streamer=streamer,
            stopping_criteria=StoppingCriteriaList([_StopFlag(stop)]),
        )
    return streamer
