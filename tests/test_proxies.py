"""The angular distances by the field's definitions, against independent computations: the last
token's (Gromov et al., PruneMe, short-transformers) per layer and per n-layer block, beside the
all-token mean this tool reported first; the block search; prune's `angular_last` criterion."""

from __future__ import annotations

import math
from typing import cast

import numpy as np
import pytest
import torch
from tiny_models import byte_tokenizer, tiny_model

from engine.core.events import Result
from engine.data.text import eval_texts
from engine.evaluation.perplexity import Batch
from engine.experiments.ablation.meters import InfluenceMeter
from engine.experiments.ablation.rankings import block_search
from engine.experiments.ablation.run import run_ablation
from engine.experiments.ablation.vocabulary import AblationSettings
from engine.experiments.prune.criteria import criterion_layers
from engine.experiments.prune.vocabulary import PruneSettings


def test_last_token_blocks_on_a_hand_built_case():
    """Two rows, the second padded after 2 tokens; at each row's last real token the state at
    layer l is the unit vector at angle theta[row][l], so the distance of l to l+n is
    |theta[l+n] - theta[l]| / pi, averaged over the rows. Other tokens point elsewhere."""
    theta = np.array([[0.0, 0.3, 0.5, 1.4, 3.0], [0.2, 0.2, 1.0, 1.1, 1.5]])  # 4 layers: inputs + output
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    last = [2, 1]

    def states(level: int) -> torch.Tensor:
        x = torch.randn(2, 3, 2)  # noise at tokens that are not last
        for row in range(2):
            x[row, last[row]] = torch.tensor([math.cos(theta[row, level]), math.sin(theta[row, level])]) * (row + 2)
        return x

    meter = InfluenceMeter(4)
    batch = Batch(torch.zeros(2, 3, dtype=torch.long), mask, np.arange(2))
    hidden = [states(level) for level in range(5)]
    for index in range(4):
        meter(batch, index, hidden[index], hidden[index + 1])
    blocks = meter.last_token_blocks()
    for n in range(1, 5):
        expected = np.abs(theta[:, n:] - theta[:, :-n]).mean(axis=0) / math.pi
        np.testing.assert_allclose(blocks[n], expected, atol=1e-6)
    assert block_search(blocks) == {str(n): int(np.argmin(blocks[n])) for n in range(1, 5)}
    assert block_search(blocks)["1"] == 0  # theta moves least from layer 0 to 1 (0.3 and 0.0)


@torch.no_grad()
def test_the_map_reports_both_definitions_as_the_hidden_states_give_them():
    """On a tiny model: `angular_last_token` and `angular_blocks` from the hidden states
    transformers returns (input of every layer; the last layer's output from a hook, since
    hidden_states[-1] is after the final norm), and `angular_distance` stays the all-token mean."""
    model, tokenizer = tiny_model("llama", seed=2), byte_tokenizer()
    texts = eval_texts(subset="paper")
    events = list(run_ablation(model, tokenizer, AblationSettings(eval_set="paper", max_length=64)))
    doc = cast(Result, events[-1]).data
    outputs = []
    handle = model.model.layers[-1].register_forward_hook(lambda m, a, out: outputs.append(out))
    per_text_last, per_text_all, counts = [], [], []
    for text in texts:
        ids = torch.tensor([tokenizer(text, truncation=True, max_length=64)["input_ids"]])
        hidden = model(input_ids=ids, output_hidden_states=True).hidden_states
        out = outputs[-1][0] if isinstance(outputs[-1], tuple) else outputs[-1]
        levels = [h[0] for h in hidden[:-1]] + [out[0]]  # [tokens, hidden] per level: 5
        cos = [torch.nn.functional.cosine_similarity(levels[i], levels[i + 1], dim=-1).clamp(-1, 1) for i in range(4)]
        per_text_all.append([float((torch.arccos(c) / math.pi).sum()) for c in cos])
        counts.append(ids.shape[1])
        unit = torch.nn.functional.normalize(torch.stack([lv[-1] for lv in levels]).double(), dim=-1)
        per_text_last.append({n: [float(torch.arccos((unit[i] @ unit[i + n]).clamp(-1, 1)) / math.pi)
                                  for i in range(5 - n)] for n in range(1, 5)})
    handle.remove()
    all_tokens = np.sum(per_text_all, axis=0) / np.sum(counts)
    for row in doc["layers"]:
        assert row["angular_distance"] == pytest.approx(all_tokens[row["layer"]], abs=1e-5)
        expected = np.mean([t[1][row["layer"]] for t in per_text_last])
        assert row["angular_last_token"] == pytest.approx(expected, abs=1e-5)
    for n in range(1, 5):
        expected = np.mean([t[n] for t in per_text_last], axis=0)
        np.testing.assert_allclose(doc["angular_blocks"][str(n)], expected, atol=1e-5)
        assert doc["angular_block_best"][str(n)] == int(np.argmin(expected))
    assert set(doc["spearman"]) == {"block_influence", "angular_distance", "angular_last_token"}


def test_the_angular_last_criterion_cuts_the_closest_last_token_block():
    blocks = {1: np.array([0.3, 0.1, 0.2, 0.4]), 2: np.array([0.5, 0.25, 0.3]), 3: np.array([0.6, 0.2])}
    chosen = criterion_layers("angular_last", (1, 2, 3), bi=np.zeros(4), angular=None, greedy=[],
                              degradation={}, last_blocks=blocks)
    assert chosen == {1: (1,), 2: (1, 2), 3: (1, 2, 3)}
    assert "angular_last" in PruneSettings().methods()
