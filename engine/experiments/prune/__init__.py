"""`prune`: which layers can go, judged five ways on the same model and texts, healed, exported.

`vocabulary` holds what the console, the store and the registry read (torch-free);
`run` the computation."""
