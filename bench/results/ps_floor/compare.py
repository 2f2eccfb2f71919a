"""Medians of old and new side by side: python3 compare.py DIR (DIR holds old_N.json and new_N.json, or old_N/ and
new_N/ folders as series.sh writes them)."""
import json, statistics, sys, glob, os
base=sys.argv[1]
data={}
for side in ("old","new"):
    for path in sorted(glob.glob(f"{base}/{side}_*/throughput.json") + glob.glob(f"{base}/{side}_*.json")):
        d=json.load(open(path))
        for r in d['runs']['results']:
            ps=[v['cores'] for k,v in r['tasks'].items() if k.startswith('ps')]
            tot=sum(v['cores'] for v in r['tasks'].values())*r['step_secs']*1000
            data.setdefault((r['variant'],side),[]).append((r['examples_per_sec'], 1000*r['step_secs']*sum(ps)/len(ps) if ps else 0, tot, r['load']))
variants=sorted({v for v,_ in data})
med=lambda xs,i: statistics.median(x[i] for x in xs)
for v in variants:
    o,n=data.get((v,'old')),data.get((v,'new'))
    if not o or not n: continue
    print(f"{v:16s} ex/s {med(o,0):8.0f} -> {med(n,0):8.0f} ({med(n,0)/med(o,0):.3f})  ps {med(o,1):.2f} -> {med(n,1):.2f} ({(med(n,1)/med(o,1) if med(o,1) else 0):.3f})  all {med(o,2):.2f} -> {med(n,2):.2f} ({med(n,2)/med(o,2):.3f}) load {[round(x[3],1) for x in o+n]}")
for side in ("old","new"):
    f=data.get(('fit_2x2',side)); fl=data.get(('ps_floor_2x2',side))
    if f and fl: print(side, "fit_2x2 ps / floor ps:", round(med(f,1)/med(fl,1),3))
    f=data.get(('fit_1x1',side)); s=data.get(('single',side))
    if f and s: print(side, "fit_1x1 vs single ex/s:", round(med(f,0)/med(s,0),3), "cpu/ex vs single:", round((med(f,2)/ (256))/(med(s,2)/256),3))
