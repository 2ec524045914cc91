import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("mask", torch.triu(torch.ones(33, 33, dtype=torch.bool), 1))

    def forward(self, x, s):
        a = F.log_softmax(x, dim=-1) + 1
        b = torch.log_softmax(x * 3.0, dim=1)
        c = F.log_softmax(s.masked_fill(self.mask, float("-inf")), -1)
        return a, b, c
