"""Teacher-student toy models of paper B: how the loss of a student falls with its depth.

`vocabulary` holds what the console, the store and the registry read (torch-free);
`run` the computation."""
