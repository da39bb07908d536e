"""The training engine: precision, compilation, checkpointing, data, the loop."""
