#!/usr/bin/env python3
"""Sums an Nsight Compute source page per warp-specialized role.

Usage: sass_by_region.py SOURCE_CSV [LABEL]
SOURCE_CSV: `ncu -i REPORT --page source --csv --print-source sass` of one
kernel profiled with source counters (`--set full --import-source yes`).
A warp-specialized kernel gives each role its registers with setmaxnreg
(SASS USETMAXREG), so the code from one USETMAXREG to the next is one role's
(warpgroup 0, 1, the producer); the code before the first is the prologue.
The mbarrier wait retry loops ptxas puts after the body land in the last
region (millions of executions, next to no samples).
Prints a markdown table a region: stall samples, warp instructions executed,
the top stall reasons, then the top opcodes by executed instructions and the
ten instructions with the most samples. Lines that do not parse are skipped.
"""
import csv
import sys
from collections import Counter, defaultdict


def num(x):
    try:
        return int(float(x))
    except (TypeError, ValueError):
        return 0


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    lines = open(sys.argv[1], encoding="utf-8", errors="replace").read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"Address"')), None)
    if start is None:
        sys.exit("sass_by_region.py: no source page header (\"Address\",...) in " + sys.argv[1])
    rows = list(csv.reader(lines[start:]))
    header, data = rows[0], [r for r in rows[1:] if len(r) == len(rows[0])]
    col = {h: i for i, h in enumerate(header)}
    stalls = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    samples, insts = Counter(), Counter()
    reasons, ops = defaultdict(Counter), defaultdict(Counter)
    region = "prologue"
    for r in data:
        src = r[col["Source"]].strip()
        if "USETMAXREG" in src:
            region = "regs " + src.split()[-1]
        executed = num(r[col["Instructions Executed"]])
        samples[region] += num(r[col["Warp Stall Sampling (All Samples)"]])
        insts[region] += executed
        for s in stalls:
            reasons[region][s] += num(r[col[s]])
        words = [w for w in src.split() if not w.startswith("@")]
        if words:
            ops[region][words[0].split(".")[0]] += executed
    label = sys.argv[2] if len(sys.argv) > 2 else sys.argv[1]
    print(f"{label}: samples and warp instructions by setmaxnreg region")
    print("| region | samples | warp instructions | top stalls | top opcodes |")
    print("| --- | --- | --- | --- | --- |")
    for region in samples:
        top = ", ".join(f"{k[6:]} {v}" for k, v in reasons[region].most_common(4) if v)
        top_ops = ", ".join(f"{k} {v}" for k, v in ops[region].most_common(6))
        print(f"| {region} | {samples[region]} | {insts[region]} | {top} | {top_ops} |")
    print()
    print("the ten instructions with the most samples:")
    key = col["Warp Stall Sampling (All Samples)"]
    for r in sorted(data, key=lambda r: -num(r[key]))[:10]:
        top = max(stalls, key=lambda s: num(r[col[s]]))
        print(f"  {r[col['Address']][-6:]} {num(r[key]):7d} {top[6:]:<14} {r[col['Source']].strip()[:70]}")


if __name__ == "__main__":
    main()
