"""Encode evaluation frames to mp4 with imageio-ffmpeg.

imageio-ffmpeg ships its own ffmpeg binary, so this works on CPU-only machines where torchcodec's wheel does
not load (it needs CUDA libraries) and without moviepy (which pins an old pillow). Frames may come from
``env.render()`` (``[H, W, C]`` each) or a TorchRL rollout's ``pixels`` (``[T, H, W, C]`` or ``[T, C, H, W]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["VideoError", "write_video"]


class VideoError(RuntimeError):
    """Frames could not be encoded (bad shape, no encoder)."""


def _as_thwc_uint8(frames: Any) -> np.ndarray:
    """``frames`` (see :func:`write_video`) as a contiguous uint8 ``[T, H, W, 3]`` array of even height and width."""
    arr = _as_thwc(_as_array(frames))
    if arr.dtype != np.uint8:
        if np.issubdtype(arr.dtype, np.floating) and arr.size and arr.max() <= 1.0:
            arr = arr * 255.0  # floats in [0, 1]
        arr = np.clip(arr, 0, 255).astype(np.uint8)
    if arr.shape[-1] == 1:
        arr = np.repeat(arr, 3, axis=-1)
    elif arr.shape[-1] == 4:
        arr = arr[..., :3]
    # H.264 with yuv420p needs even sizes: pad by repeating the last row/column instead of rescaling.
    pad_h, pad_w = arr.shape[1] % 2, arr.shape[2] % 2
    if pad_h or pad_w:
        arr = np.pad(arr, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), mode="edge")
    return np.ascontiguousarray(arr)


def _as_array(frames: Any) -> np.ndarray:
    """A tensor, an array or a sequence of frames (tensors or arrays) as one numpy array."""
    if hasattr(frames, "detach"):
        frames = frames.detach().cpu().numpy()
    elif isinstance(frames, Sequence) and not isinstance(frames, np.ndarray):
        frames = np.stack([np.asarray(f.detach().cpu() if hasattr(f, "detach") else f) for f in frames])
    return np.asarray(frames)


def _as_thwc(arr: np.ndarray) -> np.ndarray:
    """``[T, H, W]``, ``[T, H, W, C]`` or ``[T, C, H, W]`` frames as ``[T, H, W, C]`` with 1, 3 or 4 channels."""
    if arr.ndim == 3:  # grayscale [T, H, W]
        arr = arr[..., None]
    if arr.ndim != 4:
        raise VideoError(f"frames must be [T, H, W, C] or [T, C, H, W], got shape {tuple(arr.shape)}")
    if arr.shape[-1] not in (1, 3, 4) and arr.shape[1] in (1, 3, 4):
        arr = arr.transpose(0, 2, 3, 1)  # [T, C, H, W] -> [T, H, W, C]
    if arr.shape[-1] not in (1, 3, 4):
        raise VideoError(f"frames need 1, 3 or 4 channels, got shape {tuple(arr.shape)}")
    if arr.shape[0] == 0:
        raise VideoError("no frames to write")
    return arr


def write_video(frames: Any, path: Path, *, fps: int = 30) -> Path:
    """Write frames to an H.264 mp4 at ``path`` (parent directories are created).

    ``frames``: a ``[T, H, W, C]`` or ``[T, C, H, W]`` array or tensor, or a list of ``[H, W, C]`` frames; uint8,
    or floats in [0, 1] or [0, 255]. Raises :class:`VideoError` for a bad shape or without imageio-ffmpeg.
    """
    arr = _as_thwc_uint8(frames)
    try:
        import imageio.v3 as iio
        import imageio_ffmpeg  # noqa: F401 - the encoder backend; fail with a clear message if absent
    except ImportError as e:
        raise VideoError(f"writing mp4 needs imageio and imageio-ffmpeg ({e}); pip install imageio-ffmpeg") from e
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    iio.imwrite(path, arr, fps=fps, codec="libx264", macro_block_size=2, plugin="FFMPEG")
    return path
