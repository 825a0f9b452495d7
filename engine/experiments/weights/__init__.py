"""A2-A3: how predictable each weight matrix is from its layer index (Ridge on polynomial and

`vocabulary` holds what the console, the store and the registry read (torch-free);
`run` the computation."""
