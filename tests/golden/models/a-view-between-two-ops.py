import torch
import torch.nn as nn
import torch.nn.functional as F


class M(nn.Module):
    def forward(self, x, y):
        h = (x * 2).view(x.shape[0], 4, 8)
        return torch.relu(h) + 1, torch.sigmoid(y).reshape(y.shape[0], -1) * 3
