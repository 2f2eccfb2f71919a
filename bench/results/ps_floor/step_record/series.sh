#!/bin/bash
# usage: series.sh OUTDIR VARIANTS ROUNDS [FIRST]: alternates bench/throughput.py in the checkouts /work/wt/old (the
# commit before) and /work/wt/new (after), 1 repetition each per round, rounds numbered from FIRST (default 1)
out=$1; variants=$2; rounds=${3:-3}; first=${4:-1}
mkdir -p $out
for r in $(seq $first $((first + rounds - 1))); do
  for side in old new; do
    dir=/work/wt/old; [ $side = new ] && dir=/work/wt/new
    (cd $dir && .venv/bin/python bench/throughput.py --variants=$variants --batch_sizes=256 --repeats=1 --window_examples=80000 --notrivial --out=$out/${side}_$r > $out/${side}_$r.log 2>&1)
  done
done
echo finished > $out/DONE
