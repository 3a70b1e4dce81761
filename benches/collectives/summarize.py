#!/usr/bin/env python3
"""Turns the raw lines of benches/collectives/run.sh into benches/results/collectives.md: per link
and rank count, busbw (GB/s) of ours, every peer and the ring limit, medians over the repetitions
[min-max]; the ratios; and issue 15's goals, each met or missed and by how much.

    summarize.py RAW_OUTPUT_FILE OUT.md
"""
import collections
import re
import statistics as st
import subprocess
import sys

OURS = "rocectl/coll-perf"
OURS_BP = "rocectl/coll-perf+busypoll"
OURS_BLOCK = "rocectl/coll-perf+block"
OMPI = "openmpi-4.1.4/tcp"
SIZES = [4096, 65536, 1048576, 16777216, 67108864]
NAMES = {4096: "4 KiB", 65536: "64 KiB", 1048576: "1 MiB", 16777216: "16 MiB", 67108864: "64 MiB"}


def parse(path):
    rows = collections.OrderedDict()  # (peer, link, np, size) -> [(busbw, time_us, wrong)]
    limits = collections.OrderedDict()  # (kind, link, np) -> [ceiling GB/s]
    loads = []
    header = ""
    for line in open(path):
        if line.startswith("# collectives-peers.sh"):
            header = line[2:].strip()
        m = re.match(r"# load ([\d.]+) ([\d.]+) ([\d.]+)", line)
        if m:
            loads.append(float(m.group(1)))
        if line.startswith(("#", " ", "fault:")):
            continue
        f = line.split()
        if not f:
            continue
        if f[0].startswith("limit:"):
            m = re.search(r"busbw ceiling ([\d.na]+) GB/s", line)
            limits.setdefault((f[0], f[1], int(f[2])), []).append(float(m.group(1)))
        elif len(f) >= 13:
            try:
                rows.setdefault((f[0], f[1], int(f[2]), int(f[3])), []).append(
                    (float(f[10]), float(f[8]), float(f[11])))
            except ValueError:
                pass
    return rows, limits, loads, header


def med(v):
    return st.median(v) if v else float("nan")


def cell(v, fmt="{:.3f}"):
    if not v:
        return ""
    s = fmt.format(med(v))
    if len(v) > 1:
        s += (" [" + fmt + "–" + fmt + "]").format(min(v), max(v))
    return s


def main():
    raw, out = sys.argv[1], sys.argv[2]
    rows, limits, loads, header = parse(raw)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
    except Exception:
        commit = "?"
    busbw = lambda p, l, n, s: [x[0] for x in rows.get((p, l, n, s), [])]
    times = lambda p, l, n, s: [x[1] for x in rows.get((p, l, n, s), [])]
    peers = []
    for (p, _, _, _) in rows:
        if p not in peers:
            peers.append(p)
    # The peers ours is compared with: not ours, and not the loss probes (`+loss<pct>%`, a
    # different experiment; a TCP peer at 1% loss can even beat its own lossless run).
    others = [p for p in peers if not p.startswith("rocectl/") and "+loss" not in p]
    wrong = sum(x[2] for v in rows.values() for x in v)
    md = []
    md.append("# Collectives: rocectl vs the peers (issue 15)\n")
    md.append(f"`benches/collectives/run.sh` at {commit}; {header}.\n")
    if loads:
        md.append(f"Load average (1 min) at the cells: min {min(loads):.2f}, median {med(loads):.2f}, "
                  f"max {max(loads):.2f} over {len(loads)} cells. Figures taken under load are noise "
                  "for absolute values; read the ratios within one table.\n")
    md.append(f"Every measurement checked its result: {int(wrong)} wrong elements in total.\n")
    md.append("Peers in this run: " + ", ".join(peers) + "; \"best peer\" below means the best of "
              "these (the loss probes excluded).\n")
    md.append("Each cell: busbw in GB/s (1e9 B/s), f32 sum allreduce, out of place, time = max over "
              "ranks of the mean per call; median over the repetitions [min–max]. The limit rows are "
              "the per-flow rate of N simultaneous flows in a ring (a ring allreduce's busbw ceiling).\n")
    goals = []
    for link in ["veth", "lo"]:
        for n in [2, 4]:
            present = [p for p in peers if (p, link, n, 4096) in rows or any((p, link, n, s) in rows for s in SIZES)]
            if not present:
                continue
            md.append(f"\n## {link}, np={n}\n")
            md.append("| | 4 KiB time µs | " + " | ".join(NAMES[s] for s in SIZES) + " |")
            md.append("|---|---:|" + "---:|" * len(SIZES))
            for p in present:
                md.append(f"| {p} | {cell(times(p, link, n, 4096), '{:.0f}')} | "
                          + " | ".join(cell(busbw(p, link, n, s)) for s in SIZES) + " |")
            for (k, l, nn), v in limits.items():
                if l == link and nn == n:
                    md.append(f"| {k} (ceiling per flow) | | " + " | ".join(cell(v) for _ in SIZES) + " |")
            # ratios
            for ours in [OURS, OURS_BP, OURS_BLOCK]:
                if ours not in present:
                    continue
                r = []
                for s in SIZES:
                    o = med(busbw(ours, link, n, s))
                    best = max((med(busbw(p, link, n, s)) for p in others if busbw(p, link, n, s)), default=float("nan"))
                    r.append(f"{o / best:.2f}×" if best == best and best > 0 else "")
                t_o = med(times(ours, link, n, 4096))
                t_best = min((med(times(p, link, n, 4096)) for p in others if times(p, link, n, 4096)), default=float("nan"))
                md.append(f"| **{ours} / best peer** | {t_o / t_best:.2f}× time | " + " | ".join(r) + " |"
                          if t_best == t_best else f"| **{ours} / best peer** | | " + " | ".join(r) + " |")
                gso = limits.get(("limit:udp4112-ring(gso)", link, n))
                if gso:
                    md.append(f"| {ours} / UDP-GSO ceiling | | " + " | ".join(
                        f"{med(busbw(ours, link, n, s)) / med(gso):.2f}×" if busbw(ours, link, n, s) else "" for s in SIZES) + " |")

    def best_peer(link, n, s):
        c = [(med(busbw(p, link, n, s)), p) for p in others if busbw(p, link, n, s)]
        return max(c) if c else (float("nan"), "-")

    def goal(name, value, target, ok, note):
        goals.append((name, value, target, ok, note))

    # 1. 4 KiB np=2 veth: time <= 0.7x Open MPI's
    o, m = med(times(OURS, "veth", 2, 4096)), med(times(OMPI, "veth", 2, 4096))
    if o == o and m == m:
        goal("4 KiB allreduce, veth np=2: time ≤ 0.7× Open MPI's", f"{o:.0f} µs vs {m:.0f} µs = {o / m:.2f}×",
             "≤ 0.70×", o / m <= 0.7, "" if o / m <= 0.7 else f"misses by {(o / m / 0.7 - 1) * 100:.0f} %")
    # 2. >= 16 MiB np=2 veth busbw >= 1.0x best peer
    for s in [16777216, 67108864]:
        o = med(busbw(OURS, "veth", 2, s))
        b, p = best_peer("veth", 2, s)
        if o == o and b == b:
            goal(f"{NAMES[s]} veth np=2 busbw ≥ 1.0× best peer", f"{o:.3f} vs {b:.3f} ({p}) = {o / b:.2f}×",
                 "≥ 1.00×", o / b >= 1.0, "" if o / b >= 1.0 else f"misses by {(1 - o / b) * 100:.0f} %")
    # 3. loopback >= 1.2x best peer (np=2, large sizes)
    for s in [16777216, 67108864]:
        o = med(busbw(OURS, "lo", 2, s))
        b, p = best_peer("lo", 2, s)
        if o == o and b == b:
            goal(f"{NAMES[s]} lo np=2 busbw ≥ 1.2× best peer", f"{o:.3f} vs {b:.3f} ({p}) = {o / b:.2f}×",
                 "≥ 1.20×", o / b >= 1.2, "" if o / b >= 1.2 else f"misses by {(1 - o / b / 1.2) * 100:.0f} %")
    # 4. np=4 4 KiB <= 300 us median
    for link in ["veth", "lo"]:
        o = med(times(OURS, link, 4, 4096))
        if o == o:
            goal(f"4 KiB allreduce, {link} np=4: ≤ 300 µs median", f"{o:.0f} µs", "≤ 300 µs", o <= 300,
                 "" if o <= 300 else f"misses by {o - 300:.0f} µs")
    # 5. vs the UDP-GSO ring ceiling (once the data-path issue lands)
    for s in [16777216, 67108864]:
        o = med(busbw(OURS, "veth", 2, s))
        g = med(limits.get(("limit:udp4112-ring(gso)", "veth", 2), []))
        if o == o and g == g:
            goal(f"{NAMES[s]} veth np=2 busbw vs the UDP-GSO ring ceiling (later goal ≥ 0.9×)",
                 f"{o:.3f} vs {g:.3f} = {o / g:.2f}×", "≥ 0.90× (later)", o / g >= 0.9, "")
    md.append("\n## Issue 15's goals (ours = the default: a blocking completion wait after a spin of at most 50 µs where every rank has a CPU)\n")
    md.append("| goal | measured | target | met |")
    md.append("|---|---|---|---|")
    for name, value, target, ok, note in goals:
        md.append(f"| {name} | {value} | {target} | {'yes' if ok else 'no' + (' — ' + note if note else '')} |")
    # Loss probes (the `faults` peer): each peer at LOSS_PCTS random loss on rank 1's input,
    # against its own lossless run and against the best peer at the same loss.
    losses = sorted({p.rsplit("+loss", 1)[1] for p in peers if "+loss" in p}, key=lambda x: float(x.rstrip("%")))
    if losses:
        md.append("\n## Under random loss (veth np=2, nft drops that share of rank 1's input)\n")
        md.append("busbw GB/s; in brackets: the peer's own busbw without loss in this run.\n")
        md.append("| peer | loss | 1 MiB | 16 MiB |")
        md.append("|---|---:|---:|---:|")
        for pct in losses:
            for p in [p for p in peers if p.endswith("+loss" + pct)]:
                base = p.rsplit("+loss", 1)[0]
                cells = []
                for sz in [1048576, 16777216]:
                    v, b = med(busbw(p, "veth", 2, sz)), med(busbw(base, "veth", 2, sz))
                    cells.append(f"{v:.3f}" + (f" ({b:.3f})" if b == b else ""))
                md.append(f"| {base} | {pct} | " + " | ".join(cells) + " |")
            ours = OURS + "+loss" + pct
            r = []
            for sz in [1048576, 16777216]:
                o = med(busbw(ours, "veth", 2, sz))
                c = [med(busbw(p, "veth", 2, sz)) for p in peers
                     if p.endswith("+loss" + pct) and not p.startswith("rocectl/") and busbw(p, "veth", 2, sz)]
                r.append(f"{o / max(c):.2f}×" if c and o == o else "")
            md.append(f"| **{OURS} / best peer** | {pct} | " + " | ".join(r) + " |")
    faults = [l.rstrip() for l in open(raw) if l.startswith("fault:")]
    if faults:
        md.append("\n## Fault probes of the peers (what their users see)\n")
        md.append("```")
        md.extend(faults)
        md.append("```")
    open(out, "w").write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
