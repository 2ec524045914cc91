import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(1000))

    def forward(self, x):
        return F.rms_norm(x * 2, (1000,), self.weight, eps=1e-5), F.rms_norm(x, (1000,)) + 1
