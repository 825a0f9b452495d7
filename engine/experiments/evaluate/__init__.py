"""`evaluate`: zero-shot accuracy through lm-eval-harness on the loaded model and the session's

`vocabulary` holds what the console, the store and the registry read (torch-free);
`run` the computation."""
