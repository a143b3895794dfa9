"""The runner: ONNX Runtime sessions (created from the core's private copy), the session
cache, calls on precomputed checks, IO binding and exports of a composed model."""
