"""Measuring a run: FLOPs, peak FLOP/s, memory, throughput; writing metrics and summaries."""
