"""Five linears, four of them with structure planted in the values they see, for `fuselens probe`.

    fuselens probe examples/probe_planted.py

- `sparse`: its input is 2:4 sparse (two of every four features zeroed, along the reduction dim);
- `outlier`: its input has two outlier channels, 3 and 17, fifty times the others;
- `low_rank`: its weight has rank 16;
- `repeated`: it sees the same tensor in every batch (`context` below, the same each time);
- `plain`: nothing planted: the probe finds nothing to say of it.

`probe_batches()` is the data the probe runs on; the analysis takes its shapes from `example_inputs()`.
"""

import torch
import torch.nn as nn

WIDTH = 64
TOKENS = 32


class Planted(nn.Module):  # fuselens: input=(32, 64) float32, input=(8, 64) float32
    def __init__(self, width: int = WIDTH, rank: int = 16):
        super().__init__()
        self.sparse = nn.Linear(width, width)
        self.outlier = nn.Linear(width, width)
        self.low_rank = nn.Linear(width, width, bias=False)
        self.repeated = nn.Linear(width, width)
        self.plain = nn.Linear(width, width)
        keep = torch.zeros(width)
        keep[0::4] = 1.0  # of each group of four features, the first two are kept
        keep[1::4] = 1.0
        self.register_buffer("keep", keep)
        scale = torch.ones(width)
        scale[3], scale[17] = 50.0, 50.0
        self.register_buffer("scale", scale)
        with torch.no_grad():
            left, right = torch.randn(width, rank), torch.randn(rank, width)
            self.low_rank.weight.copy_(left @ right / width)

    def forward(self, x, context):
        a = self.sparse(x * self.keep)
        b = self.outlier(x * self.scale)
        c = self.low_rank(x)
        d = self.repeated(context)
        e = self.plain(x)
        return torch.cat([a + b + c + e, d])  # (one output: the rows of both inputs)


CONTEXT = torch.randn(8, WIDTH, generator=torch.Generator().manual_seed(1))


def probe_batches():
    generator = torch.Generator().manual_seed(0)
    for _ in range(8):
        yield torch.randn(TOKENS, WIDTH, generator=generator), CONTEXT
