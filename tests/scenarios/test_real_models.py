"""The real-model corpus (benches/corpus.py; the ``models`` group, out of the default run:
``pytest -m models tests/scenarios/test_real_models.py``, with torch, torchvision, transformers and
onnxscript installed): each model's verdict against the truth of its rows run alone and
together, and each batched model served to concurrent requests, each answer equal to that
request run alone. Batch-1 exports are made batchable with ``dynamic_batch``."""

from __future__ import annotations

import asyncio
import sys

import numpy as np
import pytest

import fastseq
from conftest import ROOT, session

sys.path.insert(0, str(ROOT / "benches"))
import corpus

pytestmark = pytest.mark.models
pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, corpus.Entry]:
    skipped: dict[str, str] = {}
    built = corpus.build(tmp_path_factory.mktemp("corpus"), skipped=skipped)
    assert not {k: v for k, v in skipped.items() if "export failed" in v}, skipped
    return {e.name: e for e in built}


def _pipe(e: corpus.Entry) -> fastseq.ONNXSequential:
    return fastseq.ONNXSequential(e.path, dynamic_batch=e.batch_one)


@pytest.mark.parametrize("name", [*corpus.TORCH, *corpus.OCR_MODELS, *(f"light_{n}" for n in corpus.LIGHT)])
def test_each_models_verdict_agrees_with_its_rows_alone_and_together(models, name):
    if name not in models:
        pytest.skip(f"{name} could not be made here")
    e = models[name]
    pipe = _pipe(e)
    mixes = corpus.alone_vs_together(pipe.get_session(), e.rows) > corpus.MIXES
    try:
        pipe.batcher().close()
        batched = True
    except fastseq.CompositionError as error:
        batched, reason = False, str(error)
    if mixes:
        assert not batched, f"{name} mixes its rows but was batched"
    else:
        assert batched, f"{name} keeps its rows apart but was refused: {reason}"
    if e.batch_one:  # the adapted model computes what the export computed, row by row
        original = session(e.path)
        xs = e.rows(1, 3)
        want = original.run(None, dict(zip([i.name for i in original.get_inputs()], xs)))[0]
        np.testing.assert_allclose(pipe(*xs)[0], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "name",
    [
        "resnet18",
        "vit_tiny",
        "hf_vit_tiny",
        "bert_tiny",
        "bert_dynamic_seq",
        "distilbert_tiny",
        "ppocr_v4_rec",
        "light_resnet50",
    ],
)
def test_batched_models_serve_concurrent_requests_each_as_alone(models, name):
    from fastseq.serving.model import ServedModel

    if name not in models:
        pytest.skip(f"{name} could not be made here")
    e = models[name]
    pipe = _pipe(e)
    served = ServedModel(name, pipe, max_batch_size=8)
    assert served.batcher is not None
    requests = [e.rows(1 + k % 3, k) for k in range(12)]
    names = [i.name for i in pipe.inputs]

    async def main():
        return await asyncio.gather(*(served.infer(dict(zip(names, xs))) for xs in requests))

    try:
        answers = asyncio.run(main())
    finally:
        served.close()
    for xs, got in zip(requests, answers):
        for g, w in zip(got, pipe(*xs)):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def test_bert_with_a_dynamic_sequence_axis_answers_each_length_as_alone(models):
    """Requests of different sequence lengths (each padded differently row by row) served
    concurrently: a batch joins only requests of one length, and each answer is the request
    run alone."""
    from fastseq.serving.model import ServedModel

    if "bert_dynamic_seq" not in models:
        pytest.skip("bert_dynamic_seq could not be made here")
    pipe = _pipe(models["bert_dynamic_seq"])
    served = ServedModel("bert", pipe, max_batch_size=8)
    assert served.batcher is not None
    requests = [corpus.tokens(length, 100, True)(1 + k % 3, k) for k, length in enumerate([8, 12, 5, 12, 8, 16] * 2)]

    async def main():
        return await asyncio.gather(
            *(served.infer({"input_ids": ids, "attention_mask": mask}) for ids, mask in requests)
        )

    try:
        answers = asyncio.run(main())
    finally:
        served.close()
    for (ids, mask), got in zip(requests, answers):
        np.testing.assert_allclose(got[0], pipe(ids, mask)[0], rtol=1e-4, atol=1e-4)
