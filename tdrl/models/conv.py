"""Atari convolutional torso: uint8 frames in, features out.

Replay and shared memory hold frames as uint8 (docs/design.md §1), so the scaling to ``[0, 1]`` happens here, inside
the model, on whichever device the model lives on. This is rlpyt's ``AtariDqnModel`` torso (Nature DQN sizes) as a
plain ``nn.Module``: no keys, no specs. :class:`SmallImageConv` is MinAtar's torso (Young & Tian 2019) for
images too small for it, and :func:`image_torso` picks one by size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

__all__ = ["AtariConv", "SmallImageConv", "image_torso", "is_image_spec"]


class AtariConv(nn.Module):
    """Nature DQN conv stack for stacked Atari frames, any leading batch dims.

    Input ``[*batch, C, H, W]`` uint8 (float inputs are taken as already scaled), ``image_shape = (C, H, W)``;
    output ``[*batch, output_size]`` float32.
    """

    def __init__(self, image_shape: Sequence[int]) -> None:
        super().__init__()
        _check_image_shape(image_shape)
        self.conv = nn.Sequential(
            nn.Conv2d(int(image_shape[0]), 32, 8, 4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, 2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, 1), nn.ReLU(),
        )
        self.image_shape = tuple(int(d) for d in image_shape)
        with torch.no_grad():
            self.output_size = int(self.conv(torch.zeros(1, *self.image_shape)).numel())

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        if image.shape[-3:] != self.image_shape:
            raise ValueError(f"AtariConv expects [..., {self.image_shape}], got {tuple(image.shape)}")
        return _apply(self.conv, image, self.image_shape, self.output_size)


class SmallImageConv(nn.Module):
    """One 3x3 convolution (16 channels, stride 1) and ReLU for small images such as MinAtar's ``[C, 10, 10]``
    (the MinAtar paper's DQN torso); input and output as :class:`AtariConv`."""

    def __init__(self, image_shape: Sequence[int], channels: int = 16) -> None:
        super().__init__()
        _check_image_shape(image_shape)
        self.image_shape = tuple(int(d) for d in image_shape)
        self.conv = nn.Sequential(nn.Conv2d(self.image_shape[0], channels, 3, 1), nn.ReLU())
        self.output_size = channels * (self.image_shape[1] - 2) * (self.image_shape[2] - 2)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return _apply(self.conv, image, self.image_shape, self.output_size)


def _check_image_shape(image_shape: Sequence[int]) -> None:
    if len(image_shape) != 3:
        raise ValueError(f"image_shape must be (C, H, W), got {tuple(image_shape)}")


def _apply(conv: nn.Module, image: torch.Tensor, image_shape: tuple[int, ...], output_size: int) -> torch.Tensor:
    """``conv`` over ``[*batch, C, H, W]`` frames (uint8 scaled to ``[0, 1]`` here), flattened to ``[*batch, out]``."""
    lead = image.shape[:-3]
    x = image.reshape(-1, *image_shape)
    x = x.float().div_(255.0) if x.dtype == torch.uint8 else x.float()
    return conv(x).reshape(*lead, output_size)


def is_image_spec(spec: Any) -> bool:
    """uint8 ``[C, H, W]`` observations (a TorchRL ``TensorSpec``): frames, for :func:`image_torso`."""
    return spec.dtype == torch.uint8 and len(spec.shape) == 3


def image_torso(image_shape: Sequence[int]) -> tuple[AtariConv | SmallImageConv, int]:
    """The conv torso for ``[C, H, W]`` frames and the width of the hidden layer after it: :class:`AtariConv` and
    512 (Nature DQN) for Atari-sized frames, :class:`SmallImageConv` and 128 (MinAtar) below 36 pixels."""
    if min(image_shape[1:]) < 36:  # AtariConv's 8/4, 4/2, 3/1 kernels need at least 36 pixels
        return SmallImageConv(image_shape), 128
    return AtariConv(image_shape), 512
