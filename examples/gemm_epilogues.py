"""GEMMs and the elementwise ops written after them, each a cluster that starts with the GEMM.

    fuselens analyze examples/gemm_epilogues.py

- `GeluMLP`: a transformer MLP, bias and GELU after its first projection;
- `ClampedLogits`: a projection by a weight read transposed, scaled, biased and clamped;
- `LayerScaleResidual`: a residual add of a projection scaled per channel (a layer scale's gamma).

Their inputs (16k tokens in bfloat16) are in pyproject.toml; `benchmarks/gemm_epilogue.py` builds them
at an LLM's sizes (4096 wide, 11008 and 16384 out).

`benchmarks/gemm_epilogue.py` times each against the library's GEMM and torch.compile.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class GeluMLP(nn.Module):
    def __init__(self, dim: int = 768, hidden: int = 3072):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class ClampedLogits(nn.Module):
    def __init__(self, dim: int = 768, vocab: int = 4096, scale: float = 0.5, cap: float = 30.0):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(vocab, dim) * dim**-0.5)
        self.bias = nn.Parameter(torch.zeros(vocab))
        self.scale = scale
        self.cap = cap

    def forward(self, x):
        return torch.clamp(x @ self.weight.t() * self.scale + self.bias, -self.cap, self.cap)


class LayerScaleResidual(nn.Module):
    def __init__(self, dim: int = 768, hidden: int = 3072, init: float = 1e-1):
        super().__init__()
        self.fc2 = nn.Linear(hidden, dim)
        self.gamma = nn.Parameter(init * torch.ones(dim))

    def forward(self, x, h):
        return x + self.gamma * self.fc2(h)
