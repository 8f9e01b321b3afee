"""Atari convolutional torso: uint8 frames in, features out.

Replay and shared memory hold frames as uint8 (DESIGN.md §1), so the scaling to ``[0, 1]`` happens here, inside
the model, on whichever device the model lives on. This is rlpyt's ``AtariDqnModel`` torso (Nature DQN sizes by
default) as a plain ``nn.Module``: no keys, no specs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["AtariConv"]


class AtariConv(nn.Module):
    """Conv stack for stacked Atari frames (Nature DQN sizes by default), any leading batch dims.

    Input ``[*batch, C, H, W]`` uint8 (float inputs are taken as already scaled), ``image_shape = (C, H, W)``;
    output ``[*batch, output_size]`` float32.
    """

    def __init__(self, image_shape: Sequence[int], channels: Sequence[int] = (32, 64, 64),
            kernel_sizes: Sequence[int] = (8, 4, 3), strides: Sequence[int] = (4, 2, 1),
            paddings: Sequence[int] | None = None) -> None:
        super().__init__()
        if len(image_shape) != 3:
            raise ValueError(f"image_shape must be (C, H, W), got {tuple(image_shape)}")
        if not (len(channels) == len(kernel_sizes) == len(strides)):
            raise ValueError("channels, kernel_sizes and strides must have the same length")
        paddings = paddings if paddings is not None else [0] * len(channels)
        layers: list[nn.Module] = []
        in_ch = int(image_shape[0])
        for out_ch, k, s, p in zip(channels, kernel_sizes, strides, paddings, strict=True):
            layers += [nn.Conv2d(in_ch, out_ch, k, s, p), nn.ReLU()]
            in_ch = out_ch
        self.conv = nn.Sequential(*layers)
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
