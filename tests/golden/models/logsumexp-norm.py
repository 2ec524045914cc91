import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class M(nn.Module):
    def forward(self, x):
        h = x * 4
        a = torch.logsumexp(h, dim=-1) + h.norm(dim=-1) + torch.norm(h, p=1, dim=-1)
        b = torch.norm(h, p=float("inf"), dim=-1, keepdim=True)
        return a, h / b
