#!/usr/bin/env python3
"""Sums `ncu --csv --metrics gpu__time_duration.sum` per kernel name.

Usage: ncu_by_kernel.py NCU_CSV [TOTAL_LABEL]
Prints a markdown table, largest share first: kernel (template arguments and
parameters dropped), launches, total us, us per launch, share of the sum.
Durations are measured one kernel at a time (ncu serialises launches), so the
sum is GPU work without overlap or launch gaps.
"""
import csv
import re
import sys
from collections import defaultdict


def short(name):
    name = re.sub(r"^(void )?unnamed>::", r"\1", name)  # ncu's shortened anonymous namespace
    for anon in ("(anonymous namespace)", "<unnamed>"):
        name = name.replace(anon, "anon")
    depth, out = 0, []
    for ch in name:  # template arguments
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(depth - 1, 0)
        elif depth == 0:
            out.append(ch)
    name = "".join(out).split("(")[0].strip()  # parameters
    if name.startswith("void "):
        name = name[5:]
    return name.split("::")[-1] or name


def main():
    rows = []
    with open(sys.argv[1], newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu's own messages are not CSV
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "ns")
        scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}.get(unit, 1e-3)
        rows.append((short(r["Kernel Name"]), value * scale))
    total = defaultdict(float)
    count = defaultdict(int)
    for name, us in rows:
        total[name] += us
        count[name] += 1
    grand = sum(total.values())
    print(f"{len(rows)} launches, {grand / 1e3:.3f} ms of kernel time (one at a time)")
    print("| kernel | launches | total us | us/launch | share |")
    print("| --- | --- | --- | --- | --- |")
    for name in sorted(total, key=total.get, reverse=True):
        print(f"| {name} | {count[name]} | {total[name]:.1f} | {total[name] / count[name]:.2f} | "
              f"{100 * total[name] / grand:.1f}% |")


if __name__ == "__main__":
    main()
