#!/usr/bin/env python3
"""The commit path alone: an 8 KiB write + fdatasync loop (fio) on xlfs
volumes made by different builds, alternated round by round, with the CPU
time and context switches of the mount and brick processes per operation
(from /proc).

    benches/workloads/sync_loop.py [--rounds N] [--size 16m] [--tmpfs] \
        NAME=/path/to/xlfs[:xlfs up args] ...

Each NAME gets its own `xlfs up` volume under a fresh work directory (on
tmpfs with --tmpfs: the bricks' disk out of the way, the software path
alone), taken down at the end, also on Ctrl-C. Prints one line per run
and a median (min-max) table.
"""
import argparse, json, os, re, shutil, signal, statistics, subprocess, sys, tempfile

def proc_cpu_cs(pids):
    ticks = os.sysconf("SC_CLK_TCK")
    cpu, cs = 0.0, 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            st = f.read().rsplit(")", 1)[1].split()
        cpu += (int(st[11]) + int(st[12])) / ticks
        for t in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{t}/status") as f:
                    for line in f:
                        if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                            cs += int(line.split()[1])
            except FileNotFoundError:
                pass
    return cpu, cs

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("systems", nargs="+")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size", default="16m")
    ap.add_argument("--bs", default="8k")
    ap.add_argument("--tmpfs", action="store_true")
    ap.add_argument("--workdir", default="/srv")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="sync-loop.", dir=a.workdir)
    if a.tmpfs:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4g", "tmpfs", work], check=True)
    ups = []
    def cleanup(*_):
        for name, xlfs, d, _ in ups:
            subprocess.run([xlfs, "down", d], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if a.tmpfs:
            subprocess.run(["umount", work])
        shutil.rmtree(work, ignore_errors=True)
    signal.signal(signal.SIGINT, lambda *_: (cleanup(), sys.exit(130)))
    try:
        for spec in a.systems:
            name, _, rest = spec.partition("=")
            xlfs, _, args = rest.partition(":")
            d = os.path.join(work, name)
            out = subprocess.run([xlfs, "up", d] + args.split(), check=True, capture_output=True, text=True).stdout
            pids = [int(p) for p in re.findall(r"\(pid (\d+)", out)]
            brick = [int(p) for p in re.findall(r"brick b\d+: .* \(pid (\d+)\)", out)]
            mount = [int(p) for p in re.findall(r"mounted on .* \(pid (\d+)", out)]
            ups.append((name, xlfs, d, {"mount": mount, "bricks": brick}))
        rows = {n: [] for n, *_ in ups}
        for r in range(a.rounds):
            for name, _, d, pids in ups:
                f = os.path.join(d, "mnt", "sync-loop.dat")
                before = {k: proc_cpu_cs(v) for k, v in pids.items()}
                res = subprocess.run(["fio", "--name=s", f"--filename={f}", "--rw=write", f"--bs={a.bs}",
                                      "--fdatasync=1", f"--size={a.size}", "--output-format=json"],
                                     check=True, capture_output=True, text=True).stdout
                after = {k: proc_cpu_cs(v) for k, v in pids.items()}
                os.unlink(f)
                j = json.loads(res[res.index("{"):])["jobs"][0]
                ops = j["write"]["total_ios"]
                row = {
                    "sync_us": j["sync"]["lat_ns"]["mean"] / 1000,
                    "write_us": j["write"]["clat_ns"]["mean"] / 1000,
                    "mount_cpu_us": (after["mount"][0] - before["mount"][0]) * 1e6 / ops,
                    "bricks_cpu_us": (after["bricks"][0] - before["bricks"][0]) * 1e6 / ops,
                    "mount_cs": (after["mount"][1] - before["mount"][1]) / ops,
                    "bricks_cs": (after["bricks"][1] - before["bricks"][1]) / ops,
                }
                rows[name].append(row)
                print(f"round {r+1} {name:>10}: " + ", ".join(f"{k} {v:.1f}" for k, v in row.items()), flush=True)
        keys = list(next(iter(rows.values()))[0].keys())
        print("\n| build | " + " | ".join(keys) + " |")
        print("|---" * (len(keys) + 1) + "|")
        for name, rs in rows.items():
            cells = []
            for k in keys:
                v = [x[k] for x in rs]
                cells.append(f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})")
            print(f"| {name} | " + " | ".join(cells) + " |")
    finally:
        cleanup()

main()
