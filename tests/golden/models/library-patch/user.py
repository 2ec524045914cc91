import torch
from goldennorm.layers import GatedNorm

torch.manual_seed(0)
model = GatedNorm(64)  # fuselens: input=(8, 64)
