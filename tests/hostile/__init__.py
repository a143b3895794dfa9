"""Hostile and broken input: trust boundaries, files that change under fastseq or are
not regular files, full disks, many threads."""
