import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class M(nn.Module):
    def forward(self, x):
        h = x * 3
        # fp16: the round trip's rounding error, scaled past any tolerance; straight from the
        # input, so no multiply a GPU could contract into an FMA.  (Not for bf16: the
        # interpreter converts fp32 -> bf16 by truncation, a GPU rounds to nearest even.)
        fp16 = (x.half().float() - x) * 1e5
        wrapped = (h * 10).to(torch.int8) * 4 > 100  # int8 arithmetic wraps around
        return (h.to(torch.bfloat16).float(), fp16, h.long(), h.int(), h.bool(), torch.trunc(h).bool(),
                (h * 4).to(torch.int32).float() * 0.5, h.to(torch.int16).to(torch.float32), wrapped)
