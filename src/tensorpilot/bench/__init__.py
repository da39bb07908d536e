"""`tensorpilot bench`: suites that check the field's seed claims (accelerators vs CPUs, low
precision, compilation, checkpointing, batching, scaling, energy) on this machine, through the
project's own measurement code, and say for each whether it holds here. See docs/bench.md."""
