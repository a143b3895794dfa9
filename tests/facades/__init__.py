"""Tests of the facades: ONNXSequential and Pipeline."""
