"""Shared pieces of the benchmarks: statistics, figures, the Spark session, and the report.

A *figure* is one measured number set against a baseline measured in the same run:
``{"bench", "what", "value", "unit", "baseline", "ratio", "target", "met"}``. ``ratio`` is
always a cost: our time / the baseline's time, or for rates the baseline's rate / ours (so
2.0x means "twice as slow as the baseline" either way); ``met`` is None without a target.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def stats(samples: Sequence[float]) -> dict[str, float]:
    """Median, p90, p99, min and count of ``samples`` (same unit as the samples)."""
    s = sorted(samples)
    if not s:
        return {"n": 0}
    return {"n": len(s), "median": statistics.median(s), "p90": s[min(len(s) - 1, int(0.9 * len(s)))],
            "p99": s[min(len(s) - 1, int(0.99 * len(s)))], "min": s[0]}


def figure(bench: str, what: str, value: float, unit: str, baseline: float | None = None,
           target: str | None = None, met: bool | None = None, **extra: Any) -> dict[str, Any]:
    rate = unit.endswith("/s")
    ratio = (baseline / value if rate else value / baseline) if baseline and value else None
    return {"bench": bench, "what": what, "value": value, "unit": unit, "baseline": baseline,
            "ratio": ratio, "target": target, "met": met, **extra}


def compile_package() -> str:
    """Compile sparkcoord's modules to bytecode (``__pycache__`` beside them), as pip does when
    it installs a wheel; what :func:`bench.run.main` says about the run. Called once, before
    any benchmark, by the process that runs them.

    Every Python process Spark starts for a job (the source runner at each query start, the
    task workers, the planners) imports sparkcoord's modules. An editable install (the
    README's) writes their bytecode at the first import, unless ``PYTHONDONTWRITEBYTECODE`` is
    set, as it is on the machine these benchmarks run on; then every such process compiled
    them from source again (~60 ms of a source runner's start,
    docs/decisions/085-compiled-bench-local-files.md) and the figures measured a cost a user who
    installed the package does not pay. A package that cannot be compiled (read-only) is
    measured as it is, and the report says so."""
    import compileall

    import sparkcoord

    package = os.path.dirname(os.path.abspath(sparkcoord.__file__))
    if not compileall.compile_dir(package, quiet=1):
        return f"sparkcoord NOT compiled to bytecode (cannot write under {package})"
    return f"sparkcoord compiled to bytecode before the run ({package})"


def spark_session(app: str = "sparkcoord-bench") -> Any:
    """A local[2,4] session like the tests' (UI off, quiet)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2,4]").appName(app)
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("FATAL")  # stopping a running query logs cancelled tasks
    return spark


def wait_until(predicate: Any, timeout_s: float, what: str, poll_s: float = 0.2) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"benchmark waited {timeout_s}s for {what}")
        time.sleep(poll_s)


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        text = f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
    else:
        text = str(v)
    return f"{text} {unit}".strip()


def markdown(results: dict[str, Any]) -> str:
    """The report: one table row per figure, then each benchmark's notes."""
    lines = [f"# sparkcoord benchmarks ({results['preset']} preset)", "",
             f"{results['started']}, {results['machine']}; total {results['elapsed_s']:.0f} s"
             + (f"; {results['bytecode']}" if results.get("bytecode") else "") + ". "
             "Medians. Ratio = our cost / the baseline's cost, measured in the same run (for rates: "
             "the baseline's rate / ours), so 1.00x is free and 2.00x twice as slow.", "",
             "| benchmark | what | measured | baseline | ratio | target | met |",
             "|---|---|---|---|---|---|---|"]
    for f in results["figures"]:
        met = {True: "yes", False: "**no**", None: "-"}[f["met"]]
        ratio = f"{f['ratio']:.2f}x" if f["ratio"] is not None else "-"
        lines.append(f"| {f['bench']} | {f['what']} | {_fmt(f['value'], f['unit'])} | "
                     f"{_fmt(f['baseline'], f['unit'])} | {ratio} | {f['target'] or '-'} | {met} |")
    for name, bench in results["benches"].items():
        notes = bench.get("notes")
        if notes:
            lines += ["", f"## {name}", "", *notes]
    return "\n".join(lines) + "\n"


def write_report(results: dict[str, Any], out_dir: str) -> list[str]:
    """Write results.json, results.md and the plots into ``out_dir``; returns the paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, "results.json"), os.path.join(out_dir, "results.md")]
    with open(paths[0], "w") as f:
        json.dump(results, f, indent=2, default=str)
    with open(paths[1], "w") as f:
        f.write(markdown(results))
    paths += plot(results, out_dir)
    return paths


def plot(results: dict[str, Any], out_dir: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []

    def save(fig: Any, ax: Any, name: str, title: str, ylabel: str,
             xlabel: str = "events per epoch") -> None:
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend()
        ax.grid(alpha=0.3, which="both")
        path = os.path.join(out_dir, name)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    def by_parallelism(series: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
        return sorted(series.items(), key=lambda kv: int(kv[0]))

    batches = results["benches"].get("batches", {}).get("series")
    if batches:
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for p, rows in by_parallelism(batches):
            xs = list(range(len(rows)))  # 0, 1k, 10k events: evenly spaced categories
            ax.plot(xs, [row["coordinated_ms"] for row in rows], "o-", label=f"coordinated P={p}")
            ax.plot(xs, [row["plain_ms"] for row in rows], "s--", label=f"plain source P={p}")
            ax.set_xticks(xs, [f"{row['events']:,}" for row in rows])
        save(fig, ax, "batch_time.png", "Per micro-batch: coordinated vs plain source",
             "median batch time (triggerExecution), ms")
    seal = results["benches"].get("seal", {}).get("series")
    if seal:
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for p, rows in by_parallelism(seal):
            ax.plot([row["events"] for row in rows], [row["seal_ms"] for row in rows], "o-",
                    label=f"seal P={p}")
        base = next(iter(seal.values()))
        ax.plot([row["events"] for row in base], [row["baseline_ms"] for row in base], "k--",
                label="baseline: pickled events written atomically")
        ax.set_xscale("log")
        ax.set_yscale("log")
        save(fig, ax, "seal_time.png", "Sealing an epoch", "median time inside latestOffset's seal, ms")
    files = results["benches"].get("filesource", {}).get("raw")
    if files:
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        planning = sorted(files["planning"].values(), key=lambda p: int(p["n"]))
        ns = [int(p["n"]) for p in planning]
        ax.plot(ns, [p["native_latest_offset_ms"] for p in planning], "s--",
                label="Spark's file source: latestOffset (lists the directory)")
        ax.plot(ns, [max(p["ours_latest_offset_ms"], 0.5) for p in planning], "o-",
                label="sparkcoord file source: latestOffset (seals an epoch)")
        ax.plot(ns, [p["lexical_steady_cycle_ms"] for p in planning], "^:",
                label="sparkcoord discovery cycle, lexical (beside the batches)")
        ax.plot(ns, [p["listing_steady_cycle_ms"] for p in planning], "v:",
                label="sparkcoord discovery cycle, listing (beside the batches)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        save(fig, ax, "filesource_planning.png", "Planning a trigger with N files present",
             "median ms", "files present")
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        fmts = list(files["throughput"])
        xs = range(len(fmts))
        ax.bar([x - 0.2 for x in xs], [files["throughput"][f]["rows"] / files["throughput"][f]
                                        ["native_s"] / 1e6 for f in fmts], 0.4,
               label="Spark's file source")
        ax.bar([x + 0.2 for x in xs], [files["throughput"][f]["rows"] / files["throughput"][f]
                                        ["ours_s"] / 1e6 for f in fmts], 0.4,
               label="sparkcoord file source")
        ax.set_xticks(list(xs), fmts)
        save(fig, ax, "filesource_throughput.png", "2M rows in 40 files, per trigger",
             "million rows/s", "format")
    return written
