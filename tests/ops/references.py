"""What the operators are checked against: Pillow's and numpy's resizes, greedy NMS, and
batches of real images (the two photos scikit-learn bundles, crops of them, the samples
fastseq ships), each model run by a real ONNX Runtime session."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import fastseq

Image = pytest.importorskip("PIL.Image")

FILTERS = {"nearest": Image.NEAREST, "linear": Image.BILINEAR, "cubic": Image.BICUBIC}


def run(model: onnx.ModelProto, *arrays: np.ndarray) -> list[np.ndarray]:
    """Checks the model as onnx does, then runs it in a fresh CPU session."""
    onnx.checker.check_model(model, full_check=True)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: a for i, a in zip(session.get_inputs(), arrays)})


def photos() -> list[np.ndarray]:
    from sklearn.datasets import load_sample_images

    return list(load_sample_images().images)  # china.jpg, flower.jpg: 427x640 RGB


def batch_of(name: str) -> np.ndarray:
    """uint8 RGB batches [N, H, W, 3] of several sizes and counts."""
    china, flower = photos()
    if name == "sample":
        return np.load(fastseq.ops.shipped.sample())  # 1 x 48 x 64
    if name == "digits":
        return np.load(fastseq.ops.shipped.digits_sample())["images"]  # 4 x 64 x 64
    if name == "photos":
        return np.stack([china, flower])  # 2 x 427 x 640
    if name == "crops":  # 3 x 301 x 199: tall, odd sizes
        return np.stack([china[:301, :199], flower[100:401, 300:499], china[126:, 441:]])
    raise AssertionError(name)


BATCHES = ["sample", "digits", "photos", "crops"]


def nchw_float(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2)).astype(np.float32)


def pil_float(x: np.ndarray, hw: tuple[int, int], mode: str) -> np.ndarray:
    """Pillow's float ("F") resize of every channel of every image of [N, C, H, W]."""
    return np.stack(
        [
            np.stack([np.asarray(Image.fromarray(c, "F").resize((hw[1], hw[0]), FILTERS[mode])) for c in img])
            for img in x
        ]
    )


def nearest(x: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    """The pixel under each output pixel's centre, floor((i + 0.5) * in / out), computed
    exactly (Pillow's float arithmetic goes either way where that lands on a pixel edge)."""
    rows = (2 * np.arange(hw[0]) + 1) * x.shape[-2] // (2 * hw[0])
    cols = (2 * np.arange(hw[1]) + 1) * x.shape[-1] // (2 * hw[1])
    return x[..., rows, :][..., cols]


def bilinear(x: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    """Bilinear interpolation at half-pixel centres without filtering ([..., H, W])."""

    def taps(out: int, size: int):
        c = np.clip((np.arange(out) + 0.5) * (size / out) - 0.5, 0, size - 1)
        lo = np.floor(c).astype(int)
        return lo, np.minimum(lo + 1, size - 1), (c - lo).astype(np.float32)

    (ylo, yhi, fy), (xlo, xhi, fx) = taps(hw[0], x.shape[-2]), taps(hw[1], x.shape[-1])
    rows = x[..., ylo, :] * (1 - fy)[:, None] + x[..., yhi, :] * fy[:, None]
    return rows[..., xlo] * (1 - fx) + rows[..., xhi] * fx


def nms_reference(boxes, scores, iou, score, max_boxes, cxcywh=False):
    """Greedy NMS per image and class: keep a box unless a kept one overlaps it by more
    than ``iou``; only scores above ``score``; at most ``max_boxes``."""
    if cxcywh:
        boxes = np.concatenate([boxes[..., :2] - boxes[..., 2:] / 2, boxes[..., :2] + boxes[..., 2:] / 2], -1)
    lo, hi = np.minimum(boxes[..., :2], boxes[..., 2:]), np.maximum(boxes[..., :2], boxes[..., 2:])

    def overlap(b, i, j):
        inter = np.prod(np.clip(np.minimum(hi[b, i], hi[b, j]) - np.maximum(lo[b, i], lo[b, j]), 0, None))
        union = np.prod(hi[b, i] - lo[b, i]) + np.prod(hi[b, j] - lo[b, j]) - inter
        return inter / union

    selected = []
    for b in range(scores.shape[0]):
        for c in range(scores.shape[1]):
            kept: list[int] = []
            for i in np.argsort(-scores[b, c], kind="stable"):
                if scores[b, c, i] <= score or len(kept) == max_boxes:
                    break
                if all(overlap(b, i, j) <= iou for j in kept):
                    kept.append(int(i))
            selected += [(b, c, i) for i in kept]
    return np.array(selected, np.int64).reshape(-1, 3)
