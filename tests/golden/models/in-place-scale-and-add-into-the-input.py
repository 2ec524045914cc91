import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(33, 33)
        self.scale = nn.Parameter(torch.rand(33) + 0.5)

    def forward(self, x):
        h = self.proj(x)
        h.mul_(self.scale)
        h += x
        return torch.tanh(h) @ self.proj.weight
