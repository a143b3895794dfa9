"""Tests of fastseq.serving: the KServe v2 protocol and the server, called by Triton's clients."""
