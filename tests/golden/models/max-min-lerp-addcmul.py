import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class M(nn.Module):
    def forward(self, x, y, w):
        h = x * 2
        return (torch.maximum(h, y), torch.minimum(h, y), torch.max(h, w), torch.min(y, h),
                torch.lerp(h, y, 0.3), torch.lerp(h, y, 0.8), torch.lerp(h, y, torch.sigmoid(w)),
                torch.addcmul(h, y, w, value=0.5), torch.addcmul(h, y, w),
                torch.addcdiv(h, y, w.abs() + 0.5, value=-2), torch.copysign(h, y), torch.hypot(h, y))
