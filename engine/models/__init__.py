"""A model and where it lives: loading (hub, folder, the embedded GGUF and its dequantized cache),
its placement and precision decided once from the flags and the hardware (placement.py), the
canonical view of its decoder layers (LayerStack) and their removal, the memory plan and its
out-of-memory advice, the model flags, the checks made before a load, and sweeps split over worker
processes."""
