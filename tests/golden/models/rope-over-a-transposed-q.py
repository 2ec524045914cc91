import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class M(nn.Module):
    def forward(self, q, cos, sin):
        return q * cos + torch.cat((-q[..., 16:], q[..., :16]), dim=-1) * sin
