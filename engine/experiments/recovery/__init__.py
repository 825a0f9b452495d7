"""A5: recovery speed. Gaussian noise (sigma * std(W)) hits the weight matrices of one layer, that

`vocabulary` holds what the console, the store and the registry read (torch-free);
`run` the computation."""
