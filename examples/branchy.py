"""A model whose forward() branches on a tensor's value: torch.compile breaks the graph at
the `if`, and fuselens analyzes the pieces on both sides.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class GatedNet(nn.Module):  # fuselens: input=(4096, 1024) float32
    def __init__(self, width: int = 1024):
        super().__init__()
        self.inp = nn.Linear(width, width)
        self.out = nn.Linear(width, width)

    def forward(self, x):
        h = self.inp(x)
        h = F.silu(h) * 1.5 + 0.1
        if h.mean() > 0:
            h = h * torch.sigmoid(h)
        else:
            h = torch.tanh(h) * 0.5
        h = self.out(h)
        return torch.clamp(h, -3.0, 3.0) * 2.0
