"""The same ViT classifier in PyTorch eager with AdamW: what a user would pick instead."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
    def __init__(self, width: int, mlp_dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width, eps=1e-6)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width, eps=1e-6)
        self.fc1 = nn.Linear(width, mlp_dim)
        self.fc2 = nn.Linear(mlp_dim, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class ViT(nn.Module):
    def __init__(self, width: int, depth: int, mlp_dim: int, heads: int, patch: int, image_size: int,
                 channels: int, classes: int):
        super().__init__()
        self.embed = nn.Conv2d(channels, width, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, width))
        self.pos = nn.Parameter(0.02 * torch.randn(1, (image_size // patch) ** 2 + 1, width))
        self.blocks = nn.ModuleList([Block(width, mlp_dim, heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(width, eps=1e-6)
        self.head = nn.Linear(width, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.embed(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


def make_step(shape: dict, classes: int, lr: float = 1e-3):
    """A training step closure on fixed random NCHW inputs; returns the loss as a float."""
    torch.manual_seed(0)
    model = ViT(**shape, classes=classes)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)

    def step(images: torch.Tensor, labels: torch.Tensor) -> float:
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    return step
