import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class M(nn.Module):
    def forward(self, logits, target):
        nll = -F.log_softmax(logits.float(), dim=-1).gather(-1, target[..., None])
        picked = torch.gather(torch.log_softmax(logits * 2.0, 1), 1, target.unsqueeze(1))
        return nll, picked.squeeze(-1) * 0.5
