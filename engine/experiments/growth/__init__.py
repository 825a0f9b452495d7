"""Growth Transformer Training (SCIENCE.md A6): a heterogeneous model grown phase by phase from an
importance profile, compared with a uniform model of the same size at the same token budget.

profile.py       per-layer importance classes: the paper's preset, or a session's ablation map
protocol.py      the phase table: load, validate, derive from a profile, scale to a budget
architecture.py  the per-layer-width Llama, the uniform baseline solved to equal size, cloning
data.py          the corpus, the character tokenizer, deterministic batches
checkpoint.py    atomic safetensors + JSON checkpoints of a run in progress
trainer.py       one arm: grow, train, evaluate, checkpoint, yield events
experiment.py    settings, presets and `run_growth`: every arm and seed, generations, the result;
                 `run(settings, context)`, the registry's entry
"""

from engine.experiments.growth.experiment import PRESETS, RESULT, GrowthSettings, run

__all__ = ["PRESETS", "RESULT", "GrowthSettings", "run"]
