import torch
import torch.nn as nn
import torch.nn.functional as F


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(4)
        self.pool = nn.MaxPool2d(3, 2, 1)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        a = F.max_pool2d(F.relu(x), 2)
        b = F.avg_pool2d(x * 2, 2) + 1
        c = F.max_pool2d(torch.sigmoid(x), 3, stride=2) - 0.5
        d = F.adaptive_avg_pool2d(torch.tanh(x), 1).flatten(1) * 3
        e = x * torch.sigmoid(F.relu(x).mean((2, 3), keepdim=True))
        stem = self.pool(F.relu(self.bn(x)))
        f = F.avg_pool2d(torch.exp(x), 3, stride=1, padding=1, count_include_pad=False) - x
        return a, b, c, d, e, stem, f
