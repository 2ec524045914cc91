import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class M(nn.Module):
    def forward(self, x):
        y = torch.log(x) * 3
        inf = 1.0 / torch.relu(y)
        return (torch.nan_to_num(inf), torch.nan_to_num(-inf), torch.nan_to_num(inf, 1.0, 2.0, -2.0),
                torch.nan_to_num(-inf, nan=1.0, posinf=2.0, neginf=-2.0),
                torch.isnan(y), torch.isinf(inf), torch.isfinite(inf))
