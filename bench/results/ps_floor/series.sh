#!/bin/bash
# usage: OLD=<checkout> NEW=<checkout> series.sh OUTDIR VARIANTS ROUNDS [FIRST]: alternates bench/throughput.py in two
# checkouts, each with its own .venv (OLD: the commit before, NEW: after), 1 repetition each per round, rounds numbered
# from FIRST (default 1); each round's throughput.json in OUTDIR/SIDE_N/ (compare.py reads them). OLD_ARGS and NEW_ARGS:
# more bench/throughput.py flags for that side, given after the defaults (e.g. OLD and NEW one checkout, and
# NEW_ARGS=--window_examples=320000).
out=$1; variants=$2; rounds=${3:-3}; first=${4:-1}
: "${OLD:?set OLD to the checkout before}" "${NEW:?set NEW to the checkout after}"
mkdir -p "$out"
for r in $(seq "$first" $((first + rounds - 1))); do
  for side in old new; do
    dir=$OLD; args=${OLD_ARGS:-}; [ $side = new ] && dir=$NEW && args=${NEW_ARGS:-}
    (cd "$dir" && .venv/bin/python bench/throughput.py --variants="$variants" --batch_sizes=256 --repeats=1 \
      --window_examples=80000 --notrivial $args --out="$out/${side}_$r" > "$out/${side}_$r.log" 2>&1)
  done
done
echo finished > "$out/DONE"
