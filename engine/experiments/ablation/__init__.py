"""A1: the layer-importance map. Each layer in turn is replaced (neighbour mean, skip or zero),

`vocabulary` holds what the console, the store and the registry read (torch-free);
`run` the computation."""
