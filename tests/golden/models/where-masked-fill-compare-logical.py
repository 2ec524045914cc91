import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class M(nn.Module):
    def forward(self, x, y):
        h = x * 2
        pos = h > 0
        a = torch.where(pos, h, -y)
        b = h.masked_fill(y < -1, 0.25)
        c = torch.where(h < y, h, 1.5)
        d = torch.where(y > 0.5, 2.0, h)
        inside = (h >= -0.5) & (h <= 0.5) | (y == 0) | (h != y)
        both = torch.logical_and(pos, y > 0)
        either = torch.logical_or(pos, torch.logical_not(y >= 0))
        odd = torch.logical_xor(both, either) ^ inside
        k = torch.floor(h)  # many exact ties with 0 and with each other
        ties = (k < 0, k <= 0, k > 0, k >= 0, k == torch.trunc(h), k != 0)
        return (a, b, c, d, pos, inside, odd, h.eq(1.0), h.ne(0)) + ties
