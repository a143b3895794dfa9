"""Tests of fastseq.runtime, one file per module (test_<module>.py)."""
