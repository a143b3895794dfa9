"""Every node model that the onnx package ships, composed side by side with a copy of
itself, so that every name clashes (values, nodes, subgraph names in If/Loop/Scan, local
functions). The merged model must reproduce the test data's expected outputs twice."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest

import fastseq
from conftest import session

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from onnx.backend.test.loader import load_node_model_tests

    CASES = load_node_model_tests()


def _close(a, b, rtol, atol) -> bool:
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_close(x, y, rtol, atol) for x, y in zip(a, b))
    if a is None or b is None:
        return a is None and b is None
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    if a.dtype.kind in "OUS":
        return bool((a == b).all())
    return bool(np.allclose(a.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_node_model_side_by_side(case):
    inputs, expected = case.data_sets[0]
    try:
        alone = session(case.model)
        names = [i.name for i in alone.get_inputs()]
        if len(names) != len(inputs):
            pytest.skip("test data does not feed every input")
        reference = alone.run(None, dict(zip(names, inputs)))
    except Exception as e:  # noqa: BLE001 - ONNX Runtime itself cannot run this node model
        pytest.skip(f"onnxruntime cannot run it alone: {str(e)[:80]}")
    if not _close(reference, list(expected), case.rtol, case.atol):
        pytest.skip("onnxruntime alone does not match the expected outputs")

    merged = fastseq.compose([case.model, case.model], io_maps=[[]], keep_outputs=True)
    try:
        onnx.checker.check_model(case.model)
    except onnx.checker.ValidationError:
        pass  # the source itself is outside what the checker accepts
    else:
        onnx.checker.check_model(merged)
    assert len(merged.graph.input) == 2 * len(case.model.graph.input)
    # The first copy keeps the user's names; the second one is renamed around them.
    assert [i.name for i in merged.graph.input[: len(names)]] == [i.name for i in case.model.graph.input]
    s = session(merged)
    got = s.run(None, dict(zip([i.name for i in s.get_inputs()], list(inputs) + list(inputs))))
    assert _close(got, list(reference) + list(reference), case.rtol, case.atol)


def test_node_models_mostly_run():
    """Guards the skips above: most node models really run through the merge."""
    runnable = 0
    for case in CASES[:200]:
        try:
            session(case.model)
            runnable += 1
        except Exception:  # noqa: BLE001 - counted as not runnable
            pass
    assert runnable > 150
