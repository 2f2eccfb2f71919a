#!/usr/bin/env bash
# Provides the real data some tests read (MovieLens 100K, the Criteo sample) in DIR (default ../shared/data), from
# their public sources, unless already there. Run by scripts/test.sh under CI=true; by hand: bash scripts/fetch_test_data.sh
# MovieLens may not be redistributed: it is fetched from GroupLens and kept outside the repository.
set -euo pipefail
dir="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/../shared/data}"
ml_md5=6e47046882bad158b0efbb84cd5cb987  # of ml-100k/u.data
if [ ! -f "$dir/ml-100k/u1.test" ]; then
  mkdir -p "$dir"
  tmp="$(mktemp -d)"
  curl -fsSL -o "$tmp/ml-100k.zip" https://files.grouplens.org/datasets/movielens/ml-100k.zip
  (cd "$tmp" && python3 -m zipfile -e ml-100k.zip .)
  echo "$ml_md5  $tmp/ml-100k/u.data" | md5sum -c --quiet
  mv "$tmp/ml-100k" "$dir/ml-100k"
  rm -rf "$tmp"
fi
if [ ! -f "$dir/criteo/criteo_sample.csv" ]; then
  mkdir -p "$dir/criteo"
  curl -fsSL -o "$dir/criteo/criteo_sample.csv.tmp" \
    https://raw.githubusercontent.com/shenweichen/DeepCTR/master/examples/criteo_sample.txt
  head -1 "$dir/criteo/criteo_sample.csv.tmp" | grep -q '^label,I1,' || { echo "fetch_test_data.sh: the Criteo sample has an unexpected header" >&2; exit 1; }
  mv "$dir/criteo/criteo_sample.csv.tmp" "$dir/criteo/criteo_sample.csv"
fi
