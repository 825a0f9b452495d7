"""Perplexity: batched equals an unbatched per-text reference; token weighting; the prefix cache."""

from __future__ import annotations

import math

import numpy as np
import torch
from tiny_models import tiny_model

from engine.evaluation.perplexity import Evaluator

TEXTS = [
    "The cat sat on the mat.",
    "A much longer sentence about the weather, the sea, and the mountains beyond the town.",
    "Hi.",
    "Numbers: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10.",
    "Short one here",
]


def reference_nll(model, tokenizer, text):
    """One text, no padding: the plain definition of summed next-token NLL."""
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1].double()
    logp = torch.log_softmax(logits, dim=-1)
    targets = ids[0, 1:]
    return float(-logp[torch.arange(len(targets)), targets].sum()), len(targets)


def test_batched_equals_unbatched(tiny_llama):
    model, tokenizer = tiny_llama
    evaluator = Evaluator(model, tokenizer, TEXTS, batch_size=3)
    scores = evaluator.scores()
    refs = [reference_nll(model, tokenizer, t) for t in TEXTS]
    np.testing.assert_allclose(scores.nll, [r[0] for r in refs], rtol=1e-5)
    np.testing.assert_array_equal(scores.tokens, [r[1] for r in refs])
    token_weighted = math.exp(sum(r[0] for r in refs) / sum(r[1] for r in refs))
    assert abs(scores.perplexity - token_weighted) / token_weighted < 1e-5


def test_batch_size_does_not_change_result(tiny_llama):
    model, tokenizer = tiny_llama
    one = Evaluator(model, tokenizer, TEXTS, batch_size=1).perplexity()
    many = Evaluator(model, tokenizer, TEXTS, batch_size=8).perplexity()
    assert abs(one - many) / one < 1e-5


def test_prefix_cache_scores_equal_full(tokenizer):
    for family in ("llama", "gemma2", "gpt2", "opt"):
        model = tiny_model(family)
        evaluator = Evaluator(model, tokenizer, TEXTS, batch_size=2)
        base = evaluator.build_cache()
        for start in range(len(evaluator.stack)):
            np.testing.assert_allclose(evaluator.scores(start).nll, base.nll, rtol=1e-6)


def test_cache_holds_one_copy_per_layer(tiny_llama):
    model, tokenizer = tiny_llama
    evaluator = Evaluator(model, tokenizer, TEXTS, batch_size=2)
    evaluator.build_cache()
    assert evaluator._layer_inputs is not None  # build_cache filled it
    for batch, per_layer in zip(evaluator.batches, evaluator._layer_inputs, strict=True):
        assert len(per_layer) == len(evaluator.stack)
        assert all(h.shape[:2] == batch.input_ids.shape for h in per_layer)


def test_a_non_finite_value_at_a_pad_position_does_not_spoil_the_sums():
    """float16 logits and states can overflow at pad positions (large auto batches): masking by a
    product gave inf * 0 = NaN, and that text's perplexity inf. Every masked sum must ignore them."""
    from engine.evaluation.perplexity import Batch, token_nll
    from engine.experiments.ablation.meters import InfluenceMeter
    from engine.experiments.prune.criteria import AngularMeter

    ids = torch.tensor([[1, 2, 3, 0], [4, 5, 6, 7]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    logits = torch.randn(2, 4, 9)
    clean = token_nll(logits, ids, mask)
    logits[0, 2] = torch.nan  # the prediction of the pad token
    got = token_nll(logits, ids, mask)
    assert torch.equal(got, clean)

    batch = Batch(ids, mask, np.arange(2))
    states = torch.randn(2, 4, 8)
    spoiled = states.clone()
    spoiled[0, 3] = torch.inf
    influence, angular = InfluenceMeter(2), AngularMeter(2, (1,))
    for index in range(2):
        influence(batch, index, states, spoiled)
        angular(batch, index, spoiled, spoiled)
    assert np.isfinite(np.concatenate(influence.means())).all()
    assert np.isfinite(angular.distances(1)).all()
