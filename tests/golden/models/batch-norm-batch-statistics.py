import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def _randomize(bn):
    with torch.no_grad():
        bn.running_mean.uniform_(-1.0, 1.0)
        bn.running_var.uniform_(0.25, 4.0)
        if bn.affine:
            nn.init.normal_(bn.weight)
            nn.init.normal_(bn.bias)
    return bn


class M(nn.Module):
    # Without running statistics even eval mode normalises with the batch's own: a reduction
    # over batch and space per channel, each channel a row of the kernel.
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(8, track_running_stats=False)
        self.seq = nn.BatchNorm1d(16, affine=False, track_running_stats=False)

    def forward(self, x, s):
        return F.relu(self.bn(x * 2 + 1)), self.seq(s - 1) * 2
