"""A BERT-style encoder layer: self-attention over a padded batch, the padding turned into an additive
mask on the scores and the softmax computed in float32, then a GELU feed-forward; post-LayerNorm
residual adds.

Example inputs come from `example_inputs()` below: the hidden states, and which tokens are real (1)
and which are padding (0).
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class SelfAttention(nn.Module):
    def __init__(self, hidden: int = 768, heads: int = 12, dropout: float = 0.1):
        super().__init__()
        self.heads = heads
        self.head_dim = hidden // heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.dropout = nn.Dropout(dropout)

    def split_heads(self, x):
        b, s, _ = x.shape
        return x.view(b, s, self.heads, self.head_dim).permute(0, 2, 1, 3)

    def forward(self, hidden_states, padding_mask):
        q = self.split_heads(self.query(hidden_states))
        k = self.split_heads(self.key(hidden_states))
        v = self.split_heads(self.value(hidden_states))
        # 0 where a token may be attended to, the most negative number at padding
        bias = (1.0 - padding_mask[:, None, None, :].to(q.dtype)) * torch.finfo(q.dtype).min
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        scores = scores + bias
        probs = scores.float().softmax(-1).type_as(scores)
        probs = self.dropout(probs)
        context = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        return context.view(context.shape[0], context.shape[1], -1)


class EncoderLayer(nn.Module):
    def __init__(self, hidden: int = 768, heads: int = 12, intermediate: int = 3072, dropout: float = 0.1):
        super().__init__()
        self.attention = SelfAttention(hidden, heads, dropout)
        self.output = nn.Linear(hidden, hidden)
        self.norm1 = nn.LayerNorm(hidden, eps=1e-12)
        self.ffn_in = nn.Linear(hidden, intermediate)
        self.ffn_out = nn.Linear(intermediate, hidden)
        self.norm2 = nn.LayerNorm(hidden, eps=1e-12)
        self.dropout = nn.Dropout(dropout)

    def forward(self, hidden_states, padding_mask):
        attention = self.dropout(self.output(self.attention(hidden_states, padding_mask)))
        h = self.norm1(attention + hidden_states)
        ffn = self.dropout(self.ffn_out(F.gelu(self.ffn_in(h))))
        return self.norm2(ffn + h)


def example_inputs():
    lengths = torch.tensor([512, 384, 300, 128, 512, 64, 480, 256])
    padding_mask = (torch.arange(512)[None, :] < lengths[:, None]).long()
    return torch.randn(8, 512, 768), padding_mask
