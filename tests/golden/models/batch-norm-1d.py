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
    # [N, C]: channels are the columns (also in a row kernel, before a softmax over them);
    # [N, C, L]: channels are rows; no affine part: no weight or bias.
    def __init__(self):
        super().__init__()
        self.bn = _randomize(nn.BatchNorm1d(100))
        self.seq = _randomize(nn.BatchNorm1d(16, affine=False))

    def forward(self, x, s):
        return F.gelu(self.bn(x * 2)), F.softmax(self.bn(x - 1), dim=-1), torch.sigmoid(self.seq(s)) - 1
