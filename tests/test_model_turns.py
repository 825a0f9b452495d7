"""The console's model shared a forward at a time (engine/core/turns.py): turns in the order asked,
and a generation during the map sees the model as it is, never a layer the map has changed."""

from __future__ import annotations

import threading
from typing import cast

import torch
from textual.message import Message
from tiny_models import byte_tokenizer, tiny_model

from engine.core.events import Result
from engine.core.turns import ModelTurns
from engine.evaluation.generation import generate_text
from engine.experiments.ablation.run import run_ablation
from engine.experiments.ablation.vocabulary import AblationSettings
from engine.experiments.variants import SavedModels, Variant
from engine.models.loading import LoadedModel
from sessions.session import Session
from tui.messages import TextGenerated
from tui.workers import Column, GenerationPlan, generate_work

PROMPT = "The layer"
TOKENS = 12
SETTINGS = AblationSettings(eval_set="paper", eval_batch_size=2, max_length=32)


def test_turns_come_in_the_order_asked_and_say_when_they_wait() -> None:
    turns = ModelTurns()
    order: list[int] = []
    queued = threading.Semaphore(0)
    with turns.turn():
        threads = []
        for n in range(4):  # each asks only once the one before it is queued: a known order of asking
            thread = threading.Thread(target=lambda n=n: _take(turns, n, order, queued.release))
            thread.start()
            queued.acquire()
            threads.append(thread)
        assert turns.busy and order == []
    for thread in threads:
        thread.join(10)
    assert order == [0, 1, 2, 3] and not turns.busy
    said: list[str] = []
    with turns.turn(waiting=lambda: said.append("waited")):
        pass
    assert said == []  # a free model: no wait said


def _take(turns: ModelTurns, n: int, order: list[int], waiting) -> None:
    with turns.turn(waiting=waiting):
        order.append(n)


def paused_inside_the_map(model, turns: ModelTurns | None, during) -> list:
    """The map of `model` run in a thread that stops inside its first ablated forward (layer 1 holds
    its neighbours' mean) for `during()` in this thread, or for 2 s when `during` must wait for the
    map's turn to end; the map's events."""
    layer = model.model.layers[1].self_attn.q_proj.weight
    original = layer.detach().clone()
    inside, done = threading.Event(), threading.Event()
    events: list = []

    def pause(module, args, output) -> None:
        if threading.current_thread() is mapper and not inside.is_set() and not torch.equal(layer, original):
            inside.set()
            done.wait(2.0)

    hook = model.model.layers[-1].register_forward_hook(pause)
    mapper = threading.Thread(target=lambda: events.extend(run_ablation(model, byte_tokenizer(), SETTINGS,
                                                                         turns=turns)))
    mapper.start()
    try:
        assert inside.wait(120), "the map never ablated layer 1"
        during()
        done.set()
        mapper.join(120)
    finally:
        hook.remove()
    return events


def test_a_generation_during_the_map_gives_the_unchanged_models_tokens(tokenizer) -> None:
    """The prompt pane's worker generates while the map is inside an ablated forward: it waits for
    that batch's turn and then gives exactly the unchanged model's greedy text; the map is the map
    of a run alone. Without turns the same generation sees the ablated layer (the test's teeth)."""
    model = tiny_model("llama", seed=2)
    expected = generate_text(model, tokenizer, PROMPT, TOKENS)
    alone = [e for e in run_ablation(model, tokenizer, SETTINGS) if isinstance(e, Result)][0].data
    turns = ModelTurns()
    loaded = LoadedModel(model, tokenizer, "tiny", "test", "cpu", "float32", "llama", 4)
    shown: list[Message] = []
    plan = GenerationPlan(1, PROMPT, (Column("left", Variant("original")),), TOKENS, loaded, turns,
                          threading.Event(), cast(Session, None), cast(SavedModels, None))  # neither used here
    events = paused_inside_the_map(model, turns, lambda: generate_work(shown.append, plan))
    texts = [m for m in shown if isinstance(m, TextGenerated)]
    assert texts[0].note == "waiting for the map's current batch"
    assert texts[-1].text == expected
    shared = [e for e in events if isinstance(e, Result)][0].data
    assert {k: v for k, v in shared.items() if k != "seconds"} == {k: v for k, v in alone.items() if k != "seconds"}
    unguarded: list[str] = []

    def unguarded_generation() -> None:
        try:
            unguarded.append(generate_text(model, tokenizer, PROMPT, TOKENS))
        except RuntimeError as exc:  # the map's prefix-cache hooks hand it hidden states of another shape
            unguarded.append(f"failed: {exc}")

    paused_inside_the_map(model, None, unguarded_generation)
    assert unguarded[0] != expected
    assert generate_text(model, tokenizer, PROMPT, TOKENS) == expected  # and the map put every weight back
