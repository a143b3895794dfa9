"""Side by side with the libraries fastseq stands in for: kornia's ONNX API and
onnx.compose (with its fuzzers)."""
