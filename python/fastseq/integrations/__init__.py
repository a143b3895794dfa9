"""What fastseq plugs into: Ray Data (``fastseq.ray``) and ONNX Runtime's quantization
(``fastseq.quantize``). Each imports its third-party package only when used."""
