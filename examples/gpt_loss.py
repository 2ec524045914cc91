"""A small GPT-style language model whose forward returns the training loss when it is given targets.

The loss is written as people write it: the head's logits over the whole vocabulary, flattened, upcast
to float32, and a cross-entropy that ignores the padded targets.  Only the loss reads the logits, so
they need not be written: fuselens names the pattern (linear-cross-entropy), says what a training step
holds with and without them, and rewrites the two statements as one fused loss.

Example inputs come from `example_inputs()` below: token ids and the next-token targets.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.out = nn.Linear(4 * d_model, d_model)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q = q.view(b, t, self.n_heads, -1).transpose(1, 2)
        k = k.view(b, t, self.n_heads, -1).transpose(1, 2)
        v = v.view(b, t, self.n_heads, -1).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 32000, d_model: int = 256, n_heads: int = 4, n_layers: int = 2,
                 max_len: int = 1024, pad_id: int = -100):
        super().__init__()
        self.pad_id = pad_id
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList([Block(d_model, n_heads) for _ in range(n_layers)])
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, idx, targets=None):
        b, t = idx.shape
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        if targets is None:
            return self.lm_head(x[:, [-1], :])  # the next token's logits
        logits = self.lm_head(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1), ignore_index=self.pad_id)
        return loss


def example_inputs():
    idx = torch.randint(0, 32000, (4, 256))
    targets = torch.roll(idx, -1, dims=1)
    targets[:, -1] = -100  # the last position has no next token
    return (idx, targets)
