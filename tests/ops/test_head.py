"""fastseq.ops' heads (fastseq.ops.head) on what comes out of models: softmax, argmax and
topk on a real classifier's scores, flatten on image batches, nms against a greedy reference."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import fastseq
from fastseq import ops
from ops.references import nchw_float, nms_reference, run

# --- heads -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def logits() -> tuple[np.ndarray, np.ndarray]:
    """The shipped digits classifier's scores and labels on scikit-learn's digits."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = ((data.images.reshape(len(data.images), -1) / 16.0 - 0.5) / 0.5).astype(np.float32)
    labels, scores = run(onnx.load(fastseq.ops.shipped.path("digits")), x)
    return scores, labels


@pytest.mark.parametrize("n", [1, 7, 1797])
def test_softmax_argmax_topk_on_classifier_scores(logits, n):
    scores, labels = logits[0][:n], logits[1][:n]
    (p,) = run(ops.softmax(), scores)
    e = np.exp(scores - scores.max(axis=1, keepdims=True))
    np.testing.assert_allclose(p, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
    (idx,) = run(ops.argmax(), p)
    np.testing.assert_array_equal(idx, np.argmax(scores, axis=1))
    np.testing.assert_array_equal(idx, labels)  # the classifier's own label
    (kept,) = run(ops.argmax(keepdims=True), scores)
    assert kept.shape == (n, 1)
    values, indices = run(ops.topk(3), p)
    order = np.argsort(-p, axis=1, kind="stable")[:, :3]
    np.testing.assert_array_equal(indices, order)
    np.testing.assert_array_equal(values, np.take_along_axis(p, order, axis=1))
    _, low = run(ops.topk(2, largest=False), scores)
    np.testing.assert_array_equal(low, np.argsort(scores, axis=1, kind="stable")[:, :2])
    (columns,) = run(ops.softmax(axis=0), scores)
    np.testing.assert_allclose(columns.sum(axis=0), 1, rtol=1e-5)


@pytest.mark.parametrize("n", [1, 3])
def test_nms_matches_greedy_reference(n):
    rng = np.random.default_rng(n)
    # Clusters of jittered boxes around a few objects, as a detector proposes them.
    centres = rng.uniform(50, 590, (n, 6, 2))
    xy = np.repeat(centres, 10, axis=1) + rng.normal(0, 6, (n, 60, 2))
    wh = rng.uniform(30, 90, (n, 60, 2))
    boxes = np.concatenate([xy - wh / 2, xy + wh / 2], -1).astype(np.float32)
    boxes[:, ::7] = boxes[:, ::7][..., [2, 3, 0, 1]]  # corners in either order
    scores = rng.uniform(0, 1, (n, 4, 60)).astype(np.float32)
    for iou, score, max_boxes in [(0.5, 0.0, 100), (0.3, 0.4, 3), (0.7, 0.2, 10)]:
        sel, sel_boxes, sel_scores, classes = run(ops.nms(iou, score, max_boxes), boxes, scores)
        expected = nms_reference(boxes, scores, iou, score, max_boxes)
        np.testing.assert_array_equal(sel, expected)
        np.testing.assert_array_equal(sel_boxes, boxes[expected[:, 0], expected[:, 2]])
        np.testing.assert_array_equal(sel_scores, scores[expected[:, 0], expected[:, 1], expected[:, 2]])
        np.testing.assert_array_equal(classes, expected[:, 1])
    centre = np.concatenate([xy, wh], -1).astype(np.float32)
    nbc = np.ascontiguousarray(scores.transpose(0, 2, 1))
    sel, *_ = run(ops.nms(0.45, 0.1, 20, box_format="cxcywh", scores_layout="NBC"), centre, nbc)
    np.testing.assert_array_equal(sel, nms_reference(centre, scores, 0.45, 0.1, 20, cxcywh=True))


def test_flatten_gives_feature_rows(nhwc):
    x = nchw_float(nhwc)
    (y,) = run(ops.flatten(), x)
    np.testing.assert_array_equal(y, x.reshape(len(x), -1))
    (z,) = run(ops.flatten(axis=2, dtype="uint8"), nhwc)
    np.testing.assert_array_equal(z, nhwc.reshape(len(nhwc) * nhwc.shape[1], -1))
