import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class M(nn.Module):
    def forward(self, x, y):
        h = x * 2
        p = h.abs() + 0.5
        return (1 - h, 2 / p, 3 * h, h - 1, h / 3, 0.5 + h, h + 2, -h - 0.25, torch.add(h, y, alpha=2),
                torch.sub(h, y, alpha=0.5), torch.rsub(h, 1.5), torch.mul(h, 2), torch.div(3.0, p),
                7 - p, h * True)
