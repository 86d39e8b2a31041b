"""Building blocks that several tests' small models share (imported by test_native_meta and by
test_meta_kernels' worker process)."""
import torch
import torch.nn as nn


class RmsNorm(nn.Module):
    """Llama's RMSNorm: normalised in float32, scaled, back in the input's dtype."""

    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        v = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(v + 1e-6)).to(x.dtype)
