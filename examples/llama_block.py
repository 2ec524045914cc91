"""A Llama-style decoder block: RMSNorm, rotary embeddings from a cached table sliced by
sequence length, softmax attention computed in float32, and a SwiGLU MLP.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return h.type_as(x) * self.weight


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


class LlamaBlock(nn.Module):
    # fuselens reads the inputs from pyproject.toml: [tool.fuselens.models.LlamaBlock]
    def __init__(self, dim: int = 1024, n_heads: int = 8, hidden: int = 2816, max_len: int = 4096):
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = dim // n_heads
        self.attn_norm = RMSNorm(dim)
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.mlp_norm = RMSNorm(dim)
        self.w_gate = nn.Linear(dim, hidden, bias=False)
        self.w_up = nn.Linear(dim, hidden, bias=False)
        self.w_down = nn.Linear(hidden, dim, bias=False)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        t = torch.arange(max_len).float()
        freqs = torch.outer(t, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos_cached", emb.cos(), persistent=False)
        self.register_buffer("sin_cached", emb.sin(), persistent=False)

    def forward(self, x):
        b, s, d = x.shape
        h = self.attn_norm(x)
        q = self.wq(h).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(h).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        v = self.wv(h).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        cos = self.cos_cached[:s]
        sin = self.sin_cached[:s]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_dim)
        probs = F.softmax(scores.float(), dim=-1).type_as(q)
        attn = torch.matmul(probs, v).transpose(1, 2).reshape(b, s, d)
        x = x + self.wo(attn)
        h = self.mlp_norm(x)
        gate = self.w_gate(h)
        up = self.w_up(h)
        mlp = F.silu(gate) * up
        return x + self.w_down(mlp)
