"""What the hardware is and what it can do: device choice, capability flags, peak FLOP/s."""
