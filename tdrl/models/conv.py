"""Atari convolutional torso: uint8 frames in, features out.

Replay and shared memory hold frames as uint8 (DESIGN.md §1), so the scaling to ``[0, 1]`` happens here, inside
the model, on whichever device the model lives on. This is rlpyt's ``AtariDqnModel`` torso (Nature DQN sizes) as a
plain ``nn.Module``: no keys, no specs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["AtariConv"]


class AtariConv(nn.Module):
    """Nature DQN conv stack for stacked Atari frames, any leading batch dims.

    Input ``[*batch, C, H, W]`` uint8 (float inputs are taken as already scaled), ``image_shape = (C, H, W)``;
    output ``[*batch, output_size]`` float32.
    """

    def __init__(self, image_shape: Sequence[int]) -> None:
        super().__init__()
        if len(image_shape) != 3:
            raise ValueError(f"image_shape must be (C, H, W), got {tuple(image_shape)}")
        self.conv = nn.Sequential(
            nn.Conv2d(int(image_shape[0]), 32, 8, 4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, 2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, 1), nn.ReLU(),
        )
        self.image_shape = tuple(int(d) for d in image_shape)
        with torch.no_grad():
            self.output_size = int(self.conv(torch.zeros(1, *self.image_shape)).numel())

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        lead = image.shape[:-3]
        if image.shape[-3:] != self.image_shape:
            raise ValueError(f"AtariConv expects [..., {self.image_shape}], got {tuple(image.shape)}")
        x = image.reshape(-1, *self.image_shape)
        x = x.float().div_(255.0) if x.dtype == torch.uint8 else x.float()
        return self.conv(x).reshape(*lead, self.output_size)
