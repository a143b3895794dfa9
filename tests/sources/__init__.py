"""Tests of fastseq.sources: paths, bytes, URLs and the Hugging Face Hub."""
