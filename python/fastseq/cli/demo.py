"""``fastseq demo``: built-in operators around a shipped classifier, on bundled photos."""

from __future__ import annotations

import argparse
from typing import Any

from fastseq.cli.console import Quiet, check_output, verbose_option

#: The demo: photos of digits through operators built to order (``builtin:NAME?...``, the
#: strings the CLI and pipeline files take), the shipped scikit-learn classifier, and a head.
DEMO = [
    "builtin:to_float?scale=1/255",  # uint8 [N, H, W, 3] -> float in [0, 1]
    "builtin:layout?src=NHWC&dst=NCHW",  # channels first
    "builtin:grayscale",  # RGB -> luma [N, 1, H, W]
    "builtin:resize?size=8,8&mode=linear",  # the classifier's 8x8 pixels
    "builtin:normalize?mean=0.5&std=0.5",  # as it was trained
    "builtin:flatten",  # [N, 64] feature rows
    "builtin:digits",  # logistic regression exported by skl2onnx: label, logits
    "builtin:softmax",  # logits -> probabilities
    "builtin:argmax",  # probabilities -> class indices
]


def add(sub: Any) -> None:
    d = sub.add_parser("demo", help="put built-in operators around a shipped classifier and read bundled digits")
    d.add_argument("-o", "--output", help="also export the composed pipeline here")
    verbose_option(d)
    d.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace, quiet: Quiet) -> int:
    import numpy as np

    from fastseq.facades.sequential import ONNXSequential
    from fastseq.ops import shipped as operators

    if args.output:
        check_output(args.output)
    quiet.runtime()
    # Every joint is positional but the classifier's: its second output feeds softmax.
    io_maps = [[("output", "input")]] * 6 + [[("logits", "input")], [("probabilities", "input")]]
    pipe = ONNXSequential(*DEMO, io_maps=io_maps, keep_outputs=["probabilities"])
    sample = np.load(operators.digits_sample())
    images, labels = sample["images"], sample["labels"]
    outputs = dict(zip((o.name for o in pipe.outputs), pipe(images)))
    probs, predicted = outputs["probabilities"], outputs["indices"]
    print(pipe)
    print(f"input: {len(images)} photos of handwritten digits {list(images.shape)} {images.dtype}")
    for i, (label, guess) in enumerate(zip(labels, predicted)):
        print(f"  photo {i}: predicted {guess} (probability {probs[i, guess]:.3f}), labelled {label}")
    right = int((predicted == labels).sum())
    print(f"prediction: {' '.join(map(str, predicted))} ({right} of {len(labels)} right)")
    if args.output:
        print(f"exported {pipe.export(args.output)}")
    return 0 if right == len(labels) else 1
