import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(10000)
        nn.init.normal_(self.norm.weight)
        nn.init.normal_(self.norm.bias)
        self.g = nn.Parameter(torch.randn(10000))

    def forward(self, x):
        a = F.softmax(x * 2, dim=-1)
        b = self.norm(x + 1)
        c = F.rms_norm(x - 1, (10000,), self.g)
        d = (x.exp().sum(-1, keepdim=True), x.var(-1), torch.logsumexp(x * 0.5, -1))
        # Rows entirely below / above zero: a masked lane filled with 0 would win.
        e = ((-x.abs() - 1).amax(-1), (x.abs() + 1).amin(-1))
        return a, b, c, d, e
