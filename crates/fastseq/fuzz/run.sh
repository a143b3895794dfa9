#!/usr/bin/env bash
# Runs each fuzz target for a bounded time (default 60 s each) on the stable toolchain.
# New corpus entries go to a scratch folder; crashes land in fuzz/artifacts/<target>/ and
# belong in fuzz/regressions/ (replayed by `cargo test`) once fixed.
#   fuzz/run.sh [seconds]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz
export RUSTC_BOOTSTRAP=1  # cargo fuzz passes -Z flags; the stable compiler accepts them so
for target in decode compose_two external; do
  scratch="$(mktemp -d)"
  cp fuzz/corpus/"$target"/* "$scratch"/
  cargo fuzz run --fuzz-dir fuzz "$target" "$scratch" -- -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048
  rm -rf "$scratch"
done
