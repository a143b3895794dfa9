"""What users do across the layers: fastseq without ONNX Runtime, exporters' batch
axes, every caller's own rows, the real-model corpus."""
