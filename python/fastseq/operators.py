"""The models shipped with fastseq: ``fastseq.operators.path("digits")``,
``names()``, ``sample()``, ``digits_sample()`` and ``CLASSES``; by name they are
``builtin:NAME``. The public name of :mod:`fastseq.ops.shipped`, where the files and the code
live (``import fastseq.operators`` works as well as ``fastseq.operators``)."""

from fastseq.ops.shipped import CLASSES, HERE, digits_sample, names, path, sample

__all__ = ["CLASSES", "HERE", "digits_sample", "names", "path", "sample"]
