"""Print the A/B figures of ab.sh's runs side by side: throughput, first audio p95, 503 latency."""
import json
import statistics
import sys
from pathlib import Path

out = Path(sys.argv[1])
print((out / "machine.txt").read_text().strip())
rows = {"A": [], "B": []}
for path in sorted(out.glob("run*-*.json"), key=lambda p: int(p.stem[3:].split("-")[0])):
    side = path.stem.split("-")[1]
    r = json.loads(path.read_text())
    figures = {
        "capacity req/s": r["capacity_requests_per_s"],
        "capacity audio-s/s": r["capacity_audio_s_per_s"],
        "capacity TTFA p95 ms": 1000 * r["capacity_ttfa_s"]["p95"],
        "overload admitted": r["ok"],
        "overload TTFA p95 ms": 1000 * r["admitted_ttfa_s"]["p95"],
        "503 p50 ms": 1000 * r["refused_latency_s"]["p50"],
        "503 p95 ms": 1000 * r["refused_latency_s"]["p95"],
        "503 p99 ms": 1000 * r["refused_latency_s"]["p99"],
        "probe late p99 ms (overload)": 1000 * (r["probe_late_s"]["overload"]["p99"] or 0),
    }
    rows[side].append(figures)
    print(f"{path.stem:10} " + "  ".join(f"{k} {v:.1f}" for k, v in figures.items()))
print()
print(f"{'figure':32} {'A (before) median':>16} {'B (after) median':>17} {'B/A':>6}")
for key in rows["A"][0]:
    a = statistics.median(f[key] for f in rows["A"])
    b = statistics.median(f[key] for f in rows["B"])
    print(f"{key:32} {a:16.1f} {b:17.1f} {b / a if a else float('nan'):6.2f}")
