"""Tests of fastseq.graph: the pipeline description, pipeline files, opset conversion."""
