"""A model and where it lives: loading (hub, folder, the embedded GGUF), the canonical view of its
decoder layers (LayerStack) and their removal, the memory plan and its out-of-memory advice,
device placement and the model flags, the checks made before a load, and sweeps split over
worker processes."""
