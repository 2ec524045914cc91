"""ExampleNet: three fusable regions separated by two Linear layers.

    fuselens analyze examples/example_net.py --input-shape 16384,1024
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class ExampleNet(nn.Module):  # fuselens: input=(16384, 1024) float32
    def __init__(self, width: int = 1024, hidden: int = 512):
        super().__init__()
        self.proj1 = nn.Linear(width, hidden)
        self.proj2 = nn.Linear(hidden, hidden)

    def forward(self, x):
        x = x * 2.0
        x = F.relu(x)
        x = x + 1.0

        x = self.proj1(x)
        x = F.gelu(x)
        x = torch.sigmoid(x)
        x = x * 0.5

        x = self.proj2(x)
        x = torch.tanh(x)
        x = x * 3.0
        return F.softmax(x, dim=-1)
