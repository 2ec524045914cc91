import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class M(nn.Module):
    # A mean 300 times the spread: one-pass sum(x^2) - sum(x)^2 / n would be off by ~1% in the
    # variance here, while eager's Welford (and the kernel's shifted sums) stay within 1e-4.
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(10000)
        self.gn = nn.GroupNorm(2, 8)

    def forward(self, x, img):
        h = x + 300.0
        return self.norm(h), h.var(-1), h.std(-1, correction=0), self.gn(img + 300.0)
