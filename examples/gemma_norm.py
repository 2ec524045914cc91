"""A Gemma-style block piece: the attention's output projection added to the residual stream, an
RMSNorm that computes in float32 and scales by (1 + weight) applied to that sum, then a GeGLU MLP
(tanh-approximate GELU of the gate times up) and the second residual add.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class GemmaRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        out = x.float()
        out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + self.eps)
        out = out * (1.0 + self.weight.float())
        return out.type_as(x)


class GemmaMLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        gate = self.gate_proj(x)
        up = self.up_proj(x)
        return self.down_proj(F.gelu(gate, approximate="tanh") * up)


class GemmaBlock(nn.Module):
    # fuselens reads the inputs from pyproject.toml: [tool.fuselens.models.GemmaBlock]
    def __init__(self, dim: int = 1024, hidden: int = 4096):
        super().__init__()
        self.attn_out = nn.Linear(dim, dim, bias=False)
        self.post_attention_layernorm = GemmaRMSNorm(dim)
        self.mlp = GemmaMLP(dim, hidden)

    def forward(self, hidden_states, residual):
        hidden_states = residual + self.attn_out(hidden_states)
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        return residual + hidden_states
