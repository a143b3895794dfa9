"""Tests of the top layer: the fastseq command, run as a subprocess."""
