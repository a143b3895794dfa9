"""The public classes and functions over the description and the runner: kornia's API
(``ONNXSequential``, ``ONNXModule``, ``ONNXLoader``), the graph ``Pipeline`` and the
model-returning ``compose*`` / ``merge_models``."""
