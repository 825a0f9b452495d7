"""The loss decomposition of paper B: L = c_m/m^a_m + c_l/l^a_l + c_D/D^a_D + L0 over training runs.

`vocabulary` holds what the console, the store and the registry read (torch-free);
`run` the computation."""
