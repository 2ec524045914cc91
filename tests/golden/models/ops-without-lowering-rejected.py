import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class M(nn.Module):
    def forward(self, x, y):
        a = torch.sigmoid(x) * 2
        b = torch.atan2(a, y)
        c = torch.round(b)
        return torch.relu(c) + 1
