"""Tests of the integrations: fastseq.ray, fastseq.ray_serve and fastseq.quantize."""
