#!/bin/bash
# fit_2x2 and ps_floor_2x2 with 80,000 (old_N) and 320,000 (new_N) examples per window, alternating, 3 rounds
out=$(cd "$(dirname "$0")" && pwd)
mkdir -p $out
cd "$out/../../../.."
for r in 1 2 3; do
  for w in 80000 320000; do side=old; [ $w = 320000 ] && side=new
    .venv/bin/python bench/throughput.py --variants=fit_2x2,ps_floor_2x2 --batch_sizes=256 --repeats=1 \
      --window_examples=$w --notrivial --out=$out/${side}_$r > $out/${side}_$r.log 2>&1
    mv $out/${side}_$r/throughput.json $out/${side}_$r.json && rm -r $out/${side}_$r
  done
done

