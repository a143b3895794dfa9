"""Tests of the base layer: fastseq.errors and the extension's stub (fastseq._core)."""
