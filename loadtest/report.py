"""`python -m loadtest report DIR`: the plots a reader wants, as PNG files in DIR/plots.

DIR is a `run` output (one result set) or a `compare` output (one subdirectory per server, drawn
on the same axes). Plots: TTFA and E2E percentiles against load, throughput against load, 503
rate against offered load, the CDF of TTFA per step, and the underrun of every stream.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from loadtest import listener_metrics as metrics
from loadtest.results import result_sets

COLORS = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"]


def _plt():
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    return plt


def _x_label(kind: str) -> str:
    return "concurrency (closed loop)" if kind == "closed" else "arrival rate, requests/s (open loop)"


def _label(rs: dict[str, Any]) -> str:
    return rs["meta"].get("label") or Path(rs["dir"]).name


def _series(rs: dict[str, Any], getter) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for s in rs["steps"]:
        y = getter(s)
        if y is not None:
            xs.append(s["value"])
            ys.append(y)
    return xs, ys


def _log_x(ax, sets: list[dict[str, Any]]) -> None:
    values = sorted({s["value"] for rs in sets for s in rs["steps"]})
    if len(values) > 1 and values[-1] / max(values[0], 1e-9) >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xticks(values)
    ax.set_xticklabels([f"{v:g}" for v in values])
    ax.minorticks_off()


def make_plots(result_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    plt = _plt()
    from matplotlib import ticker

    sets = result_sets(result_dir)
    out = Path(out_dir) if out_dir else Path(result_dir) / "plots"
    out.mkdir(parents=True, exist_ok=True)
    kind = sets[0]["steps"][0]["kind"] if sets[0]["steps"] else "closed"
    title_tail = " vs ".join(_label(rs) for rs in sets)
    paths = []

    # 1. TTFA and E2E percentiles against load
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, name in ((axes[0], "ttfa_s", "time to first audio"), (axes[1], "e2e_s", "end to end")):
        for i, rs in enumerate(sets):
            for q, style in (("p50", "-"), ("p95", "--"), ("p99", ":")):
                xs, ys = _series(rs, lambda s: None if s[key][q] is None else s[key][q] * 1000)
                ax.plot(xs, ys, style, marker="o", ms=4, color=COLORS[i % len(COLORS)],
                        label=f"{_label(rs)} {q}" if len(sets) > 1 else q)
        ax.set_title(name)
        ax.set_xlabel(_x_label(kind))
        ax.set_ylabel("ms (successful requests)")
        ax.set_ylim(bottom=0)
        _log_x(ax, sets)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Latency percentiles: {title_tail}")
    paths.append(_save(fig, out / "latency.png", plt))

    # 2. Throughput against load
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, name in ((axes[0], "audio_s_per_wall_s", "audio seconds per wall second"),
                          (axes[1], "requests_per_s", "successful requests per second")):
        for i, rs in enumerate(sets):
            xs, ys = _series(rs, lambda s: s[key])
            ax.plot(xs, ys, "-", marker="o", color=COLORS[i % len(COLORS)], label=_label(rs))
        ax.set_title(name)
        ax.set_xlabel(_x_label(kind))
        ax.set_ylim(bottom=0)
        _log_x(ax, sets)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Throughput: {title_tail}")
    paths.append(_save(fig, out / "throughput.png", plt))

    # 3. 503 rate against offered load (open loop: the measured arrival rate)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, rs in enumerate(sets):
        offered = (lambda s: s["value"]) if kind == "closed" else (lambda s: s["offered_rate_per_s"])
        xs = [offered(s) for s in rs["steps"]]
        color = COLORS[i % len(COLORS)]
        name = f"{_label(rs)} " if len(sets) > 1 else ""
        ax.plot(xs, [100 * s["rejection_rate"] for s in rs["steps"]], "-", marker="o", color=color,
                label=f"{name}503 rate")
        ax.plot(xs, [100 * s["error_rate"] for s in rs["steps"]], ":", marker="x", color=color,
                label=f"{name}other errors")
        if kind == "open":
            ax.plot(xs, [100 * s["drop_rate"] for s in rs["steps"]], "--", marker="s", ms=3, color=color,
                    label=f"{name}dropped by client cap")
    ax.set_xlabel("offered load: " + ("concurrency" if kind == "closed" else "arrivals per second"))
    ax.set_ylabel("% of requests sent")
    ax.set_ylim(-2, 102)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"Rejections against offered load: {title_tail}")
    paths.append(_save(fig, out / "rejections.png", plt))

    # 4. CDF of TTFA, one curve per step (and per server)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    cmap = plt.get_cmap("viridis")
    styles = ["-", "--", ":", "-."]
    for i, rs in enumerate(sets):
        labels = [s["step"] for s in rs["steps"]]
        for j, step in enumerate(labels):
            ttfa = sorted(r["ttfa_s"] * 1000 for r in rs["rows"]
                          if r["step"] == step and r["phase"] == "measure" and r["outcome"] == "ok"
                          and r["ttfa_s"] is not None)
            if not ttfa:
                continue
            ys = [(k + 1) / len(ttfa) for k in range(len(ttfa))]
            ax.step(ttfa, ys, where="post", linestyle=styles[i % len(styles)],
                    color=cmap(j / max(1, len(labels) - 1) * 0.9),
                    label=f"{_label(rs)} {step}" if len(sets) > 1 else step)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(ticker.FuncFormatter(
        lambda v, _: f"{v:g}" if f"{v:g}"[0] in "25" else ""))  # 20, 50, 200, 500 ... between decades
    ax.set_xlabel("time to first audio, ms (log scale)")
    ax.set_ylabel("fraction of successful requests")
    ax.set_ylim(0, 1.01)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    ax.set_title(f"TTFA distribution: {title_tail}")
    paths.append(_save(fig, out / "ttfa_cdf.png", plt))

    # 5. Underrun of every stream (each dot a request), with the 100 ms continuity line
    fig, ax = plt.subplots(figsize=(8, 4.2))
    rng = random.Random(0)
    steps = [s["step"] for s in sets[0]["steps"]]
    width = 0.8 / len(sets)
    floor = 0.1  # ms: zero underrun is drawn here on the log axis
    for i, rs in enumerate(sets):
        xs, ys = [], []
        for j, step in enumerate(steps):
            for r in rs["rows"]:
                if r["step"] == step and r["phase"] == "measure" and r["outcome"] == "ok" and r["underrun_s"] is not None:
                    xs.append(j - 0.4 + width * (i + 0.5) + rng.uniform(-width / 3, width / 3))
                    ys.append(max(floor, r["underrun_s"] * 1000))
        ax.scatter(xs, ys, s=8, alpha=0.5, color=COLORS[i % len(COLORS)], label=_label(rs))
    ax.axhline(metrics.CONTINUOUS_UNDERRUN_S * 1000, color="tab:red", lw=1, ls="--",
               label="100 ms: continuous below")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xticks(range(len(steps)))
    ax.set_xticklabels(steps)
    ax.set_xlim(-0.6, len(steps) - 0.4)
    ax.set_ylabel(f"longest player wait, ms (log; {floor:g} = none)")
    ax.set_xlabel("step")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    ax.set_title(f"Underrun per stream: {title_tail}")
    paths.append(_save(fig, out / "underrun.png", plt))
    return paths


def ttfa_cdfs(ax, series: list[tuple[list[float], float, str, str]]) -> None:
    """TTFA distributions as CDFs on one log-time axis, each p95 marked (where the tails part):
    `series` holds (sorted TTFA seconds, p95 seconds, colour, name) per server or setup."""
    for values_s, p95_s, color, name in series:
        if not values_s:
            continue
        values = [v * 1000 for v in values_s]
        ax.step(values, [(i + 1) / len(values) for i in range(len(values))], where="post", color=color,
                label=f"{name}: p95 {p95_s * 1000:.0f} ms")
        ax.axvline(p95_s * 1000, color=color, linestyle=":", linewidth=1)
    ax.axhline(0.95, color="grey", linewidth=0.6)
    ax.set_xscale("log")
    ax.set_xlabel("time to first audio, ms (log)")
    ax.set_ylabel("fraction of requests")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(True, which="both", alpha=0.3)


def _save(fig, path: Path, plt) -> Path:
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _ms_cell(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}"


def format_summary_table(summaries: list[dict[str, Any]]) -> str:
    head = (f"{'target':>16} {'step':>9} {'ok':>5} {'503':>4} {'err':>4} {'drop':>4} {'req/s':>6} {'audio/s':>7} "
            f"{'TTFA p50':>8} {'p95':>6} {'p99':>6} {'E2E p50':>7} {'p95':>6} {'RTF p50':>7} {'underrun p95':>12} {'in-flight':>9}")
    lines = [head, "-" * len(head)]
    for s in summaries:
        rtf = s["rtf"]["p50"]
        lines.append(
            f"{s['target'][:16]:>16} {s['step']:>9} {s['ok']:>5} {s['rejected_503']:>4} {s['errors']:>4} {s['dropped']:>4} "
            f"{s['requests_per_s']:>6.2f} {s['audio_s_per_wall_s']:>7.2f} {_ms_cell(s['ttfa_s']['p50']):>8} "
            f"{_ms_cell(s['ttfa_s']['p95']):>6} {_ms_cell(s['ttfa_s']['p99']):>6} {_ms_cell(s['e2e_s']['p50']):>7} "
            f"{_ms_cell(s['e2e_s']['p95']):>6} {('-' if rtf is None else f'{rtf:.3f}'):>7} "
            f"{_ms_cell(s['underrun_s']['p95']):>12} {s['mean_in_flight']:>9.1f}")
    return "\n".join(lines) + "\n(times in ms over successful requests; 503s, errors and client drops counted apart)"
