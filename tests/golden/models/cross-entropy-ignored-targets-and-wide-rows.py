import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class M(nn.Module):
    def forward(self, logits, target):
        ignored = torch.where(target < 4, -100, target)  # (the targets are 0..15)
        loss = nn.CrossEntropyLoss(label_smoothing=0.05)(logits.float(), ignored)
        return loss, F.cross_entropy(logits.float() / 2, target, ignore_index=-100, reduction="none")
