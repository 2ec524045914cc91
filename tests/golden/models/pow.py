import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class M(nn.Module):
    def forward(self, x, e):
        h = x * 1.5
        p = h.abs() + 0.5
        k = torch.floor(e * 3)
        return (
            h.pow(2), h ** 3, torch.pow(h, 0), p ** -2, h ** -3,  # small integers: products
            h ** 11, h ** 1.5, p ** 1.7, p ** -1.3,  # the _pow helper (h ** 1.5 is NaN below 0)
            p ** 0.5, p ** -0.5,  # sqrt, rsqrt
            torch.pow(p, e), torch.pow(h, e), torch.pow(h, k),  # tensor exponents
            torch.pow(2.0, h), torch.pow(0.5, k), torch.pow(-2.0, k), torch.pow(0.0, k),  # scalar bases
            torch.relu(h) ** 2.5, torch.relu(h) ** -1.5,  # zero bases
            h ** float("inf"), torch.pow(-2.0, k / torch.relu(e)),  # infinite exponents
        )
