import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class M(nn.Module):
    def forward(self, x, s):
        h = torch.sigmoid(x)
        h = h.permute(0, 2, 1, 3)
        h = h * 2
        h = h.transpose(1, 3) + s.unsqueeze(-1)
        h = torch.tanh(h.unsqueeze(0).squeeze(0).movedim(1, 2))
        return h.permute(2, 0, 3, 1) - 1  # not its own inverse
