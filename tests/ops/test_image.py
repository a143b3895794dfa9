"""fastseq.ops' image operators (fastseq.ops.image) against Pillow and numpy on real images,
in several sizes and batch sizes: pixels and channels, then geometry."""

from __future__ import annotations

import numpy as np
import pytest

from fastseq import ops
from ops.references import FILTERS, Image, batch_of, bilinear, nchw_float, nearest, pil_float, run

# --- pixels and channels ---------------------------------------------------------------


def test_to_float_layout_and_channel_order(nhwc):
    (f,) = run(ops.to_float(), nhwc)
    assert f.dtype == np.float32
    np.testing.assert_array_equal(f, nhwc.astype(np.float32) * np.float32(1 / 255))
    (half,) = run(ops.to_float(scale=2.0, dtype="uint16", to="float16", rank=4), nhwc.astype(np.uint16))
    np.testing.assert_array_equal(half, (nhwc.astype(np.float16) * 2).astype(np.float16))

    (chw,) = run(ops.layout("NHWC", "NCHW", dtype="uint8"), nhwc)
    np.testing.assert_array_equal(chw, nhwc.transpose(0, 3, 1, 2))
    (back,) = run(ops.layout("nchw", "nhwc"), nchw_float(nhwc))
    np.testing.assert_array_equal(back, nhwc.astype(np.float32))

    (bgr,) = run(ops.rgb_to_bgr(layout="NHWC", dtype=np.uint8), nhwc)
    np.testing.assert_array_equal(bgr, nhwc[..., ::-1])
    (bgr_chw,) = run(ops.rgb_to_bgr(), nchw_float(nhwc))
    np.testing.assert_array_equal(bgr_chw, nchw_float(nhwc)[:, ::-1])


def test_grayscale_matches_pillow_and_the_luma_formula(nhwc):
    (grey,) = run(ops.grayscale(layout="NHWC", dtype="uint8"), nhwc)
    reference = np.stack([np.asarray(Image.fromarray(img).convert("L")) for img in nhwc])[..., None]
    diff = np.abs(grey.astype(int) - reference)
    # Pillow rounds in 16-bit fixed point; the model in float32.
    assert diff.max() <= 1 and (diff == 0).mean() > 0.99

    x = nchw_float(nhwc) / 255
    (luma,) = run(ops.grayscale(), x)
    expected = (0.299 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2])[:, None]
    np.testing.assert_allclose(luma, expected, atol=1e-6)
    (three,) = run(ops.grayscale(channels=3), x)
    np.testing.assert_allclose(three, np.repeat(expected, 3, axis=1), atol=1e-6)


def test_normalize_per_channel_and_per_layout(nhwc):
    x = nchw_float(nhwc) / 255
    (y,) = run(ops.normalize(), x)
    mean = np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 3, 1, 1)
    std = np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 3, 1, 1)
    np.testing.assert_allclose(y, (x - mean) / std, rtol=1e-6, atol=1e-6)
    (z,) = run(ops.normalize(0.5, 0.25, layout="NHWC"), nhwc.astype(np.float32) / 255)
    np.testing.assert_allclose(z, (nhwc.astype(np.float32) / 255 - 0.5) / 0.25, atol=1e-6)
    rows = x.reshape(len(x), -1)[:, :5]
    (r,) = run(ops.normalize([1, 2, 3, 4, 5], 2, layout="NC"), rows)
    np.testing.assert_allclose(r, (rows - np.arange(1, 6)) / 2, atol=1e-6)


# --- geometry --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_matches_pillow(nhwc, mode):
    x = nchw_float(nhwc)
    h, w = x.shape[2:]
    for hw, antialias in [((2 * h + 3, w + w // 2), False), ((h // 3 + 1, w // 4 + 1), mode != "nearest")]:
        (y,) = run(ops.resize(hw, mode, antialias=antialias), x)
        assert y.shape == (len(x), 3, *hw)
        # Pillow filters when shrinking: the model does with antialias=True.
        reference = nearest(x, hw) if mode == "nearest" else pil_float(x, hw, mode)
        np.testing.assert_allclose(y, reference, atol=0.02, err_msg=f"{mode} {hw}")
    if mode == "linear":  # shrinking without the filter samples pixels: Pillow has no such mode
        (y,) = run(ops.resize((h // 3 + 1, w // 4 + 1)), x)
        np.testing.assert_allclose(y, bilinear(x, (h // 3 + 1, w // 4 + 1)), atol=0.01)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_uint8_channels_last_matches_pillow(mode):
    x = batch_of("crops")
    for hw, antialias in [((500, 333), False), ((100, 70), mode != "nearest")]:
        (y,) = run(ops.resize(hw, mode, antialias=antialias, layout="NHWC", dtype="uint8"), x)
        ref = np.stack([np.asarray(Image.fromarray(img).resize((hw[1], hw[0]), FILTERS[mode])) for img in x])
        if mode == "nearest":
            ref = nearest(x.transpose(0, 3, 1, 2), hw).transpose(0, 2, 3, 1)
        if mode == "cubic" and not antialias:
            # Pillow's uint8 bicubic clips its overshoot between the two passes (up to 12
            # levels off its own float result), as ONNX Runtime's antialiased uint8 path
            # does; without antialias the model resizes in float32 and rounds once.
            ref = np.clip(np.round(pil_float(nchw_float(x), hw, mode)), 0, 255).transpose(0, 2, 3, 1)
        diff = np.abs(y.astype(int) - ref)
        # Pillow computes uint8 resizes in fixed point: a level or two apart, rarely.
        assert diff.max() <= 2 and diff.mean() < 0.5, (mode, hw, diff.max(), diff.mean())
    if mode == "cubic":  # shrinking without the filter goes through float32 channels-first
        (y,) = run(ops.resize((100, 70), "cubic", layout="NHWC", dtype="uint8"), x)
        (f,) = run(ops.resize((100, 70), "cubic"), nchw_float(x))
        expected = np.clip(np.round(f), 0, 255).transpose(0, 2, 3, 1)
        np.testing.assert_array_equal(y, expected)


def test_resize_keeping_the_aspect_ratio():
    for name in ("photos", "crops", "sample"):
        x = nchw_float(batch_of(name))
        h, w = x.shape[2:]
        for policy, pick in (("not_smaller", max), (True, max), ("not_larger", min)):
            (y,) = run(ops.resize(224, "linear", keep_aspect=policy, antialias=True), x)
            scale = pick(224 / h, 224 / w)
            hw = (int(np.floor(h * scale + 0.5)), int(np.floor(w * scale + 0.5)))
            assert y.shape[2:] == hw
            assert (min(hw) if pick is max else max(hw)) == 224
            np.testing.assert_allclose(y, pil_float(x, hw, "linear"), atol=0.02)


def test_center_crop_crops_and_pads_like_torchvision(nhwc):
    x = nchw_float(nhwc)
    h, w = x.shape[2:]
    for ch, cw in [(h // 2, w // 3), (h - 1, w - 2), (h + 5, w + 2), (h, w)]:
        (y,) = run(ops.center_crop((ch, cw)), x)
        padded = np.pad(
            x,
            [
                (0, 0),
                (0, 0),
                ((max(ch - h, 0)) // 2, (max(ch - h, 0) + 1) // 2),
                ((max(cw - w, 0)) // 2, (max(cw - w, 0) + 1) // 2),
            ],
        )
        top, left = (padded.shape[2] - ch) // 2, (padded.shape[3] - cw) // 2
        np.testing.assert_array_equal(y, padded[:, :, top : top + ch, left : left + cw])
    (sq,) = run(ops.center_crop(32, layout="NHWC", dtype="uint8"), nhwc)
    top, left = (h - 32) // 2, (w - 32) // 2
    np.testing.assert_array_equal(sq, nhwc[:, top : top + 32, left : left + 32])


def test_letterbox_fits_pads_and_reports_the_mapping(nhwc):
    h, w = nhwc.shape[1:3]
    size = (96, 128)
    (y, scale, padding) = run(ops.letterbox(size, fill=114, layout="NHWC", dtype="uint8", antialias=True), nhwc)
    s = min(size[0] / h, size[1] / w)
    fitted = (int(np.floor(h * s + 0.5)), int(np.floor(w * s + 0.5)))
    top, left = (size[0] - fitted[0]) // 2, (size[1] - fitted[1]) // 2
    np.testing.assert_allclose(scale, s, rtol=1e-6)
    assert padding.tolist() == [top, left, size[0] - fitted[0] - top, size[1] - fitted[1] - left]
    assert y.shape == (len(nhwc), *size, 3)
    ref = np.full_like(y, 114)
    ref[:, top : top + fitted[0], left : left + fitted[1]] = np.stack(
        [np.asarray(Image.fromarray(img).resize(fitted[::-1], Image.BILINEAR)) for img in nhwc]
    )
    assert np.abs(y.astype(int) - ref).max() <= 3
    # The right edge maps back through (x - left) / scale, within the rounding of the size.
    assert abs(fitted[1] / scale - w) <= 0.5 / scale + 1e-3
