"""A4: the five manipulation strategies for a layer (zero, clone, blend, low-rank SVD blend, scale),

`vocabulary` holds what the console, the store and the registry read (torch-free);
`run` the computation."""
