"""How a model is measured: perplexity by protocol with the prefix cache, bootstrap intervals and
rank statistics, lm-eval accuracy with the generation check, greedy generation, and the batched
power-law fits of the scaling experiments."""
