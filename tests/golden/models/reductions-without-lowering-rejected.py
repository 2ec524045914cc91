import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class M(nn.Module):
    def forward(self, x, ids):
        h = x * 2
        return (h.prod(-1) + 1, torch.cumsum(h, -1) * 2, torch.argmax(h * 3, -1) + 1, (ids * 2).sum(-1),
                (h > 0).any(-1))
