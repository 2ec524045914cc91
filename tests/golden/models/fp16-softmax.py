import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class M(nn.Module):
    def forward(self, x):
        return (F.softmax(x * 0.5, dim=-1), F.softmax(x.float(), dim=-1).type_as(x),
                torch.softmax(x + 1, -1, dtype=torch.float32), (x * 2).sum(-1, dtype=torch.float32))
