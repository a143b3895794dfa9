"""Ray Serve (extra ``fastseq-onnx[ray-serve]``): ``fastseq.ray_serve.application``, pipelines
served on a Ray cluster on the KServe v2 protocol. The public name of
:mod:`fastseq.integrations.ray_serve`, where the code lives."""

from fastseq.integrations.ray_serve import application

__all__ = ["application"]
