"""The probe: sketches of the values flowing through each GEMM call site of a model run on data, and the
opportunities they show (`contracts/probe.py` is what it reports)."""
