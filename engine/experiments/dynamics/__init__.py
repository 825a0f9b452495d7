"""B1: hidden-state dynamics. For every token and layer l, the angle between the layer's input and

`vocabulary` holds what the console, the store and the registry read (torch-free);
`run` the computation."""
