import torch
import torch.nn as nn
import torch.nn.functional as F


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.inorm = nn.InstanceNorm2d(8, affine=True)
        self.batch = nn.BatchNorm2d(8, track_running_stats=False)
        with torch.no_grad():
            for norm in (self.inorm, self.batch):
                norm.weight.uniform_(0.5, 1.5)
                norm.bias.uniform_(-1, 1)

    def forward(self, x, y):
        return F.relu(self.inorm(x * 2)), torch.sigmoid(self.batch(y + 1))
