#!/usr/bin/env python3
"""Markdown table from compare.sh's raw lines.

Each input line is "SYSTEM | LABEL: ... VALUE UNIT ..." as the workload
scripts in ../shared/bench print them; the value kept is the one before
"files/s" (smallfile), "MiB/s by wall clock" (fio-seq) or "TPS" (pgbench),
higher is better for all. Per (LABEL, SYSTEM) the table shows the median,
min-max and rounds; then xlfs's median over GlusterFS's and over ext4's.
"""
import re
import statistics
import sys
from collections import OrderedDict

UNITS = [
    (re.compile(r"([0-9.]+) files/s"), "files/s"),
    (re.compile(r"([0-9.]+) MiB/s by wall clock"), "MiB/s"),
    (re.compile(r"([0-9.]+) TPS"), "TPS"),
]


def parse(lines):
    data = OrderedDict()  # label -> system -> [values]
    units = {}
    systems = []
    for line in lines:
        if " | " not in line:
            continue
        system, rest = line.rstrip("\n").split(" | ", 1)
        if ": " not in rest or rest.startswith(("cpu:", "note:")):
            continue
        label = rest.split(": ", 1)[0]
        for rx, unit in UNITS:
            m = rx.search(rest)
            if m:
                data.setdefault(label, OrderedDict()).setdefault(system, []).append(float(m.group(1)))
                units[label] = unit
                if system not in systems:
                    systems.append(system)
                break
    return data, units, systems


def cell(vals):
    if not vals:
        return "—"
    med = statistics.median(vals)
    return f"{med:.0f} ({min(vals):.0f}-{max(vals):.0f}, n={len(vals)})"


def ratio(a, b):
    if not a or not b:
        return "—"
    return f"{statistics.median(a) / statistics.median(b):.2f}x"


def main():
    with open(sys.argv[1]) as f:
        data, units, systems = parse(f)
    others = [s for s in systems if s not in ("glusterfs", "ext4")]
    head = ["workload", "unit"] + systems
    for s in others:
        if "glusterfs" in systems:
            head.append(f"{s} / GlusterFS")
        if "ext4" in systems:
            head.append(f"{s} / ext4")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for label, per in data.items():
        row = [label, units[label]] + [cell(per.get(s, [])) for s in systems]
        for s in others:
            if "glusterfs" in systems:
                row.append(ratio(per.get(s), per.get("glusterfs")))
            if "ext4" in systems:
                row.append(ratio(per.get(s), per.get("ext4")))
        print("| " + " | ".join(row) + " |")
    print("\n(median (min-max, n=rounds); higher is better)")


if __name__ == "__main__":
    main()
