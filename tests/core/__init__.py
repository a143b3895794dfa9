"""The Rust core through the public API: composition (adapters, the graph form, scoping,
errors), external data, and differential and property tests against ONNX Runtime."""
