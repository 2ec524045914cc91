import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def rotate_half(x):
    return torch.cat((-x[..., x.shape[-1] // 2 :], x[..., : x.shape[-1] // 2]), dim=-1)


class M(nn.Module):
    def forward(self, q, cos, sin):
        rot, rest = q[..., :24], q[..., 24:]
        return torch.cat(((rot * cos) + (rotate_half(rot) * sin), rest), dim=-1)
