"""Measured time per line, per cluster and per opaque op: a model's forward under `torch.profiler`."""
