"""Tests of fastseq.ops: the operators, their protobuf writer and the shipped models."""
