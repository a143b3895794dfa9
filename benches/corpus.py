"""The real-model corpus of docs/real-models.md, built offline: models exported the way people
export them (torchvision and transformers with random weights, torch's two exporters, small
torch nets), PP-OCR's paddle2onnx models from rapidocr-onnxruntime's wheel, and the batch-1
architectures of the onnx wheel's ``backend/test/data/light``. Nothing comes from a hub.

    models = corpus.build(folder)          # [Entry], each written to folder/NAME.onnx

Used by ``benches/bench_models.py`` (the docs' table) and ``tests/scenarios/test_real_models.py`` (the
``models`` test group). Needs torch, torchvision, transformers and onnxscript (the dynamo
exporter); ``pip download`` fetches rapidocr-onnxruntime's wheel (a model missing its
package is left out, with the reason)."""

from __future__ import annotations

import subprocess
import sys
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

RAPIDOCR = "rapidocr-onnxruntime==1.4.4"
OCR_MODELS = {
    "ppocr_v4_det": "ch_PP-OCRv4_det_infer.onnx",
    "ppocr_v4_rec": "ch_PP-OCRv4_rec_infer.onnx",
    "ppocr_cls": "ch_ppocr_mobile_v2.0_cls_infer.onnx",
}
#: the torch-made models, by name (built by _torch_models)
TORCH = [
    "resnet18",
    "resnet18_dynamo",
    "mobilenet_v3_small",
    "squeezenet1_1",
    "efficientnet_b0",
    "lraspp_segmenter",
    "vit_tiny",
    "bert_tiny",
    "bert_dynamic_seq",
    "distilbert_tiny",
    "hf_vit_tiny",
    "class_token_encoder",
    "lstm",
    "mlp",
    "mlp_dynamo",
    "centred (mixes)",
    "batch_attention (mixes)",
]
#: exported with a dynamic sequence axis too (axis 1 of every input and output)
DYNAMIC_SEQUENCE = {"bert_dynamic_seq"}
LIGHT = [
    "bvlc_alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "vgg19",
    "zfnet512",
]


@dataclass
class Entry:
    """One model of the corpus: where it was written, who exported it, and rows for it."""

    name: str
    exporter: str
    path: Path
    #: rows -> the inputs (one array per graph input, in order) for that many rows
    rows: Callable[[int, int], list[np.ndarray]]
    #: a fixed first axis of 1 (exported with batch 1): batched only through --dynamic-batch
    batch_one: bool = False
    notes: dict[str, Any] = field(default_factory=dict)


def floats(*shape: int) -> Callable[[int, int], list[np.ndarray]]:
    return lambda n, seed: [np.random.default_rng(seed).standard_normal((n, *shape)).astype(np.float32)]


def tokens(length: int, vocab: int, mask: bool) -> Callable[[int, int], list[np.ndarray]]:
    """Token ids and, where the model takes one, an attention mask with padding at the end."""

    def make(n: int, seed: int) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        ids = rng.integers(1, vocab, (n, length)).astype(np.int64)
        if not mask:
            return [ids]
        m = np.ones((n, length), np.int64)
        for k in range(n):
            m[k, length - int(rng.integers(0, length // 2)) :] = 0
        return [ids, m]

    return make


# --- torch -------------------------------------------------------------------------------------------
def _export(
    module: Any,
    args: tuple[Any, ...],
    path: Path,
    names: list[str],
    outs: list[str],
    dynamo: bool = False,
    sequence: bool = False,
) -> None:
    import torch

    module.eval()
    # The fused fast path of nn.MultiheadAttention in eval mode has no ONNX export.
    torch.backends.mha.set_fastpath_enabled(False)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if dynamo:
            batch = torch.export.Dim("batch", min=1, max=1024)
            shapes = tuple({0: batch} for _ in args)  # by position: forward's own argument names vary
            torch.onnx.export(
                module,
                args,
                str(path),
                input_names=names,
                output_names=outs,
                dynamo=True,
                dynamic_shapes=shapes,
                external_data=False,
            )
        else:
            axes = {n: {0: "batch", 1: "sequence"} if sequence else {0: "batch"} for n in [*names, *outs]}
            torch.onnx.export(
                module,
                args,
                str(path),
                input_names=names,
                output_names=outs,
                dynamic_axes=axes,
                opset_version=17,
                dynamo=False,
            )


def _torch_models() -> dict[
    str,
    tuple[
        str,
        Callable[[], tuple[Any, tuple[Any, ...], list[str], list[str]]],
        Callable[[int, int], list[np.ndarray]],
        bool,
    ],
]:
    """name -> (exporter, make (module, example args, input names, output names), rows, dynamo)."""
    import torch
    import torchvision
    from torch import nn

    def tv(make: Callable[[], Any], size: int = 64) -> Callable[[], Any]:
        return lambda: (make(), (torch.randn(2, 3, size, size),), ["image"], ["logits"])

    class Mlp(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))

        def forward(self, x: Any) -> Any:
            return self.net(x).softmax(-1)

    class Lstm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = nn.LSTM(8, 16, batch_first=True, bidirectional=True)
            self.head = nn.Linear(32, 3)

        def forward(self, x: Any) -> Any:
            return self.head(self.rnn(x)[0][:, -1])

    class Centred(nn.Module):  # mixes: each row minus the batch's mean
        def forward(self, x: Any) -> Any:
            return x - x.mean(0, keepdim=True)

    class BatchAttention(nn.Module):  # mixes: rows attend to the other rows of the batch
        def forward(self, x: Any) -> Any:
            return torch.softmax(x @ x.T, dim=-1) @ x

    class Classifier(nn.Module):  # a class token broadcast over the batch, then attention
        def __init__(self) -> None:
            super().__init__()
            self.cls = nn.Parameter(torch.randn(1, 1, 16))
            self.layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, dropout=0.0)
            self.head = nn.Linear(16, 5)

        def forward(self, x: Any) -> Any:
            t = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)
            return self.head(self.layer(t)[:, 0])

    def hf(kind: str) -> Callable[[], Any]:
        import transformers as tr

        def make() -> Any:
            torch.manual_seed(0)
            small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
            if kind == "bert":
                model = tr.BertModel(tr.BertConfig(vocab_size=100, max_position_embeddings=64, **small))
            elif kind == "distilbert":
                model = tr.DistilBertModel(
                    tr.DistilBertConfig(
                        vocab_size=100, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=64
                    )
                )
            else:
                model = tr.ViTModel(tr.ViTConfig(image_size=32, patch_size=8, num_channels=3, **small))
            model.config.return_dict = False
            if kind == "vit":
                return (Wrapped(model), (torch.randn(2, 3, 32, 32),), ["pixel_values"], ["hidden"])
            ids = torch.randint(1, 100, (2, 12))
            return (Wrapped(model), (ids, torch.ones_like(ids)), ["input_ids", "attention_mask"], ["hidden"])

        return make

    class Wrapped(nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *args: Any) -> Any:
            return self.inner(*args)[0]

    def vision(make: Callable[[], Any], size: int = 64, dynamo: bool = False) -> tuple:
        """A torchvision classifier on [N, 3, size, size] images."""
        exporter = "torchvision, torch.onnx (dynamo)" if dynamo else "torchvision, torch.onnx (TorchScript)"
        return (exporter, tv(make, size), floats(3, size, size), dynamo)

    def net(module: Callable[[], Any], *shape: int, out: str = "y", dynamo: bool = False) -> tuple:
        """A small torch.nn module on x [N, *shape]."""
        exporter = "torch.nn, torch.onnx (dynamo)" if dynamo else "torch.nn, torch.onnx (TorchScript)"
        return (exporter, lambda: (module(), (torch.randn(2, *shape),), ["x"], [out]), floats(*shape), dynamo)

    def hf_model(kind: str, cls: str, rows: Callable[[int, int], list[np.ndarray]]) -> tuple:
        """A transformers ``cls`` (random weights) exported by TorchScript."""
        return (f"transformers {cls}, torch.onnx (TorchScript)", hf(kind), rows, False)

    torch.manual_seed(0)
    return {
        "resnet18": vision(torchvision.models.resnet18),
        "resnet18_dynamo": vision(torchvision.models.resnet18, dynamo=True),
        "mobilenet_v3_small": vision(torchvision.models.mobilenet_v3_small),
        "squeezenet1_1": vision(torchvision.models.squeezenet1_1),
        "efficientnet_b0": vision(torchvision.models.efficientnet_b0),
        "lraspp_segmenter": (
            "torchvision, torch.onnx (TorchScript)",
            lambda: (
                Seg(torchvision.models.segmentation.lraspp_mobilenet_v3_large(weights=None, weights_backbone=None)),
                (torch.randn(2, 3, 64, 64),),
                ["image"],
                ["mask"],
            ),
            floats(3, 64, 64),
            False,
        ),
        "vit_tiny": vision(lambda: torchvision.models.VisionTransformer(32, 8, 2, 2, 32, 64, num_classes=10), 32),
        "bert_tiny": hf_model("bert", "BertModel", tokens(12, 100, True)),
        "bert_dynamic_seq": (
            "transformers BertModel, torch.onnx (TorchScript), dynamic sequence axis",
            hf("bert"),
            tokens(12, 100, True),
            False,
        ),
        "distilbert_tiny": hf_model("distilbert", "DistilBertModel", tokens(12, 100, True)),
        "hf_vit_tiny": hf_model("vit", "ViTModel", floats(3, 32, 32)),
        "class_token_encoder": net(Classifier, 6, 16, out="logits"),
        "lstm": net(Lstm, 10, 8),
        "mlp": net(Mlp, 16),
        "mlp_dynamo": net(Mlp, 16, dynamo=True),
        "centred (mixes)": net(Centred, 16),
        "batch_attention (mixes)": net(BatchAttention, 16),
    }


def Seg(inner: Any) -> Any:  # a module's constructor, named as one
    from torch import nn

    class Segmenter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: Any) -> Any:
            return self.inner(x)["out"]

    return Segmenter()


# --- the wheels ---------------------------------------------------------------------------------------
def _ocr(folder: Path) -> dict[str, Path] | str:
    """PP-OCR's models unzipped from rapidocr-onnxruntime's wheel, or why not."""
    wheels = folder / "wheels"
    found = list(wheels.glob("rapidocr_onnxruntime-*.whl")) if wheels.is_dir() else []
    if not found:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", RAPIDOCR, "-d", str(wheels), "-q"],
            capture_output=True,
            text=True,
            timeout=600,
        )
        found = list(wheels.glob("rapidocr_onnxruntime-*.whl"))
        if not found:
            return f"pip download {RAPIDOCR} failed: {done.stderr.strip()[-200:]}"
    out = {}
    with zipfile.ZipFile(found[0]) as z:
        for name, file in OCR_MODELS.items():
            target = folder / f"{name}.onnx"
            if not target.exists():
                target.write_bytes(z.read(f"rapidocr_onnxruntime/models/{file}"))
            out[name] = target
    return out


def _light(name: str) -> Path:
    import onnx

    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"light_{name}.onnx"


def _light_rows(path: Path) -> Callable[[int, int], list[np.ndarray]]:
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    inits = {t.name for t in m.graph.initializer}
    shapes = [[d.dim_value for d in vi.type.tensor_type.shape.dim][1:] for vi in m.graph.input if vi.name not in inits]
    return lambda n, seed: [np.random.default_rng(seed).standard_normal((n, *s)).astype(np.float32) for s in shapes]


def build(folder: Path, only: list[str] | None = None, skipped: dict[str, str] | None = None) -> list[Entry]:
    """Every model of the corpus written under ``folder`` (kept between runs: a model already
    there is not exported again); ``only`` picks some by name. Models that cannot be made
    here go to ``skipped`` with the reason."""
    folder.mkdir(parents=True, exist_ok=True)
    skipped = {} if skipped is None else skipped
    entries: list[Entry] = []
    want = (lambda n: n in only) if only else (lambda n: True)
    try:
        made = _torch_models()
    except ImportError as e:
        made = {}
        skipped["torch models"] = f"{e.name} is not installed"
    for name, (exporter, make, rows, dynamo) in made.items():
        if not want(name):
            continue
        path = folder / f"{name.split(' ')[0]}.onnx"
        if not path.exists():
            try:
                module, args, ins, outs = make()
                _export(module, args, path, ins, outs, dynamo, sequence=name in DYNAMIC_SEQUENCE)
            except Exception as e:  # noqa: BLE001 - one exporter failing leaves the others
                skipped[name] = f"export failed: {type(e).__name__}: {str(e)[:200]}"
                continue
        entries.append(Entry(name, exporter, path, rows))
    if any(want(n) for n in OCR_MODELS):
        ocr = _ocr(folder)
        if isinstance(ocr, str):
            skipped["PP-OCR"] = ocr
        else:
            shapes = {"ppocr_v4_det": (3, 64, 64), "ppocr_v4_rec": (3, 48, 96), "ppocr_cls": (3, 48, 192)}
            for name, path in ocr.items():
                if want(name):
                    entries.append(
                        Entry(name, "paddle2onnx (rapidocr-onnxruntime 1.4.4's wheel)", path, floats(*shapes[name]))
                    )
    for name in LIGHT:
        if want(f"light_{name}"):
            path = _light(name)
            entries.append(
                Entry(
                    f"light_{name}",
                    "onnx wheel backend/test/data/light (batch 1)",
                    path,
                    _light_rows(path),
                    batch_one=True,
                )
            )
    return entries


# --- the truth ------------------------------------------------------------------------------------
def alone_vs_together(session: Any, rows: Callable[[int, int], list[np.ndarray]], n: int = 4, seed: int = 0) -> float:
    """The largest difference between ``n`` rows run together and each run alone, over every
    output, relative to the output's size where it is over 1 (0 for a model that keeps its
    rows apart, up to float noise)."""
    names = [i.name for i in session.get_inputs()]
    xs = rows(n, seed)
    together = session.run(None, dict(zip(names, xs)))
    worst = 0.0
    for k in range(n):
        alone = session.run(None, dict(zip(names, [x[k : k + 1] for x in xs])))
        for t, a in zip(together, alone):
            t, a = np.asarray(t, np.float64)[k : k + 1], np.asarray(a, np.float64)
            if t.shape != a.shape:
                return float("inf")
            # relative to the output's size, but never below 1: values near 0 (a detector's
            # empty map) differ in their last bits between batch sizes without mixing
            scale = max(1.0, float(np.abs(a).max(initial=0)))
            worst = max(worst, float(np.abs(t - a).max(initial=0)) / scale)
    return worst


#: a relative difference above this between rows alone and together is rows that mix
MIXES = 1e-3
