#!/usr/bin/env bash
# Builds what a release ships into dist/ (or $1): the wheel for this Linux machine as abi3
# manylinux_2_17 (one wheel for CPython 3.11+, glibc 2.17+: Debian 9+, Ubuntu 18.04+, RHEL 7+,
# Amazon Linux 2) and the sdist, then checks both (tools/check_dist.py: the platform tag with
# auditwheel, the size, every file the package must carry, the version).
#
#     pip install -r tools/requirements-dist.txt     # maturin, ziglang, auditwheel
#     bash tools/build_dist.sh [OUT]
#
# `pip wheel .` would tag the wheel linux_x86_64 (PyPI refuses it) and a plain `maturin build`
# manylinux_2_34 (glibc 2.34+ only): zig links against the older glibc from any host.
# .github/workflows/release.yml passes the same flags to maturin (tests/project/test_release.py
# compares them with FLAGS below).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-dist}
FLAGS=(--release --locked --compatibility manylinux2014 --zig)

# maturin finds zig on PATH; the ziglang package keeps it in its own folder (maturin's own
# fallback, `python -m ziglang`, failed here with ziglang 0.17).
if ! command -v zig >/dev/null; then
    PATH="$(python3 -c 'import os, ziglang; print(os.path.dirname(ziglang.__file__))'):$PATH"
fi

# Build into a folder of its own, so that the check sees this build and nothing older.
stage=$(mktemp -d "${TMPDIR:-/tmp}/fastseq-dist.XXXXXX")
trap 'rm -rf "$stage"' EXIT
maturin build "${FLAGS[@]}" --out "$stage"
maturin sdist --out "$stage"
python3 tools/check_dist.py "$stage"
mkdir -p "$out"
for f in "$stage"/*; do
    mv -f "$f" "$out/"
    echo "built $out/$(basename "$f")"
done
