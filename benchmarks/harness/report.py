"""BENCHMARKS.md and its plots, generated from the suites' JSON lines (``benchmarks/run.py`` writes them).

Every ratio on the page is computed from two rows of the same run; the papers' figures, which come from
their authors' machines and data, sit beside ours and are never divided into them.
"""

import json
import math
import os
import statistics
from collections import defaultdict

from . import paper

SUITES = ("quick", "paper", "scaling", "sweep", "streaming")
COMMAND = "python benchmarks/run.py --suite {suite}"

# The papers' own figures (see the docstrings of ``paper``); quoted as printed, never computed with.
PAPER_VCGMM = """\
| data (N, D, C) | algorithm | N′ | η | speedup (time) | speedup (distances) | EM iterations |
|---|---|---|---|---|---|---|
| CIFAR-10 (50,000, 3,072, 500) | var-GMM-S G=5 | - | −0.75 % | 12.6× | 16.4× | 16.7 |
| | LWCS | 2^12 | 10.34 % | 17.3× | 17.6× | 8.0 |
| | vc-GMM G=5 | 2^12 | 8.98 % | 166.4× | 207.8× | 13.4 |
| SUSY (5,000,000, 18, 2,000) | var-GMM-S G=5 | - | 0.76 % | 10.1× | 83.8× | 63.7 |
| | LWCS | 2^15 | 9.89 % | 395.3× | 381.8× | 19.3 |
| | vc-GMM G=5 | 2^15 | 9.55 % | 1300.4× | 9964.3× | 62.8 |
| KDD (145,751, 74, 500) | vc-GMM G=5 | 2^13 | 10.81 % | 91.5× | 361.0× | 17.9 |
| SONG (515,345, 90, 4,000) | vc-GMM G=5 | 2^16 | 9.23 % | 166.6× | 513.9× | 22.3 |

Hirschberger, Forster, Lücke, Table 1: 50 runs, one thread each, their C++ k-means++ (D² seeding + Lloyd)
as the baseline; AFK-MC2 alone appears only in their Fig. 1 (no values in the text). Also the authors'
code on blobs1m_d16, C = 1000 (issue #3): about +10 % against scikit-learn's k-means++, 170× less CPU."""

PAPER_NMBATCH = """\
Newling & Fleuret, Fig. 2 (k = 50, b0 = 5,000, ρ = 100, first k rows as centres, 20 seeds): on the dense
sets (INFMNIST, STL10P, KDDC98) nmbatch reaches within 2 % of E* (the lowest validation energy of all runs)
10× to 100× sooner than mini-batch, and "within 1 % of the empirical minimum 100× earlier"; STL10P (the
6×6×3 image patches our `imgpatches` imitate) is shown only as a curve. The authors' code on our blobs
(issue #4): 0.02 s / 0.07 s of CPU to 1 %, 35–50× less than exact bounded k-means."""

PAPER_VRKM = """\
| method | Oxford K=1000: speedup, loss | CIFAR-100 K=100: speedup, loss |
|---|---|---|
| batch KM | 1.00×, 6,574,972 | 1.00×, 6,147,102 |
| mini-batch KM | -, 6,599,589 | -, 6,193,337 |
| growbatch-ρ | 1.26×, 6,572,795 | -, 6,161,949 |
| VRKM | 2.07×, 6,569,367 | 2.04×, 6,134,762 |
| VRKM++ | 4.14×, 6,568,354 | 4.30×, 6,132,739 |

Zhao et al., Table 3: time to reach batch k-means' final loss ("-": never)."""

PAPER_SBE = """\
| k | mb-EM min / max / mean | SBE min / max / mean |
|---|---|---|
| 6 | 20.44 / 23.47 / 21.84 | 20.30 / 21.20 / 20.49 |
| 8 | 15.92 / 18.58 / 16.40 | 15.68 / 15.68 / 15.68 |
| 10 | 15.91 / 18.18 / 16.17 | 15.68 / 15.68 / 15.68 |

Yin, Pham, Oberman, Osher, 784-d table (100 runs, real MNIST digits as the centroids, global minimum about
15.68; EM at k = 8: 15.68 / 27.28 / 20.02). Iris: EM sometimes stops at about 0.48, SBE "around 0.264
every time" (the histogram's values are not in the text)."""

# The authors' SLK program run on this project's machine (issue #18): mean NMI / ACC from
# k-means++ seeds (digits and segment 10 seeds, mnist5k 5), λ = 1.3, σ from the 4-NN graph.
PAPER_SLK = {
    ("digits", "SLK-BO"): (0.809, 0.769),
    ("digits", "SLK-MS"): (0.801, 0.760),
    ("mnist5k", "SLK-BO"): (0.634, 0.606),
    ("mnist5k", "SLK-MS"): (0.744, 0.732),
    ("segment", "SLK-BO"): (0.394, 0.450),
    ("segment", "SLK-MS"): (0.369, 0.457),
}


# ------------------------------------------------------------------ reading


def read_rows(results_dir, tiny=False):
    """{suite: rows of its latest run} from ``suite-<name>.jsonl`` files (``-tiny.jsonl`` for smoke runs)."""
    out = {}
    for suite in SUITES:
        path = os.path.join(results_dir, f"suite-{suite}{'-tiny' if tiny else ''}.jsonl")
        if os.path.exists(path):
            with open(path) as f:
                rows = [json.loads(line) for line in f if line.strip()]
            last = rows[-1]["run"] if rows else None
            out[suite] = [r for r in rows if r["run"] == last]
    return out


def of(rows, kind):
    return [r for r in rows if r.get("kind") == kind]


# ------------------------------------------------------------------ formatting


def fmt(v, spec=".3g", none="–"):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return none
    return format(v, spec)


def pct(v):
    return "–" if v is None else f"{100 * v:+.2f} %"


def times(v):
    return "–" if v is None else f"{v:.1f}×" if v >= 10 else f"{v:.2f}×"


def mib(v):
    return "–" if not v else f"{v / 2**20:.0f}"


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# ------------------------------------------------------------------ sections


def machine_section(runs):
    lines = ["## Machine", ""]
    for suite, rows in runs.items():
        m = next((r for r in rows if r.get("kind") == "machine"), None)
        if m:
            lines.append(
                f"- `--suite {suite}` (run {m['run']}): {m['cpu']}, {m['cores']} cores, "
                f"{mib(m['memory_bytes'])} MiB, Python {m['python']}, numpy {m['numpy']}, numba {m['numba']}, "
                f"dask {m['dask']}, {m['platform']}."
            )
    return lines + [
        "",
        "Our fits run on a LocalCluster of this machine (2 workers × 1 thread unless noted); each "
        "competitor runs in a fresh process with the library's default threading (all cores).",
        "",
    ]


def tables_section(suite, rows, plot):
    rows = of(rows, "table")
    if not rows:
        return []
    lines = [
        f"## Every algorithm on real and synthetic data (`{COMMAND.format(suite=suite)}`)",
        "",
        "η = QE / QE of scikit-learn's k-means++ Lloyd − 1 and speedup = its wall time / ours, both from the "
        "same run, data, k and seed. Wall time is the median of 3 fits (of fewer when they took over 30 s: "
        "`wall_runs` in the JSON lines has each); QE is on the full data; overhead is "
        "the engine's share of the wall time (round trips × an empty iteration); memory is the peak resident "
        "size of the busiest worker (or the competitor's process). Dominated: a scikit-learn or faiss "
        "method on the same data was both faster and at a lower QE (it names the first such).",
        "",
    ]
    by_data = defaultdict(list)
    for r in rows:
        if r["seed"] == 0:
            by_data[(r["data"], r["k"], r["n"], r["d"])].append(r)
    for (name, k, n, d), rs in by_data.items():
        lines += [f"### {name} ({n:,} × {d}, k = {k})", ""]
        lines.append(
            table(
                [
                    "tool",
                    "algorithm",
                    "wall s",
                    "QE",
                    "η",
                    "speedup",
                    "iterations",
                    "distance evals",
                    "overhead",
                    "peak MiB",
                    "dominated",
                    "status",
                ],
                [
                    [
                        r["tool"],
                        r["algo"],
                        fmt(r.get("wall_s")),
                        fmt(r.get("qe"), ".5g"),
                        pct(r.get("eta")),
                        times(r.get("speedup")),
                        fmt(r.get("n_iter"), "d"),
                        fmt(r.get("distance_evals"), ".3g"),
                        "–" if r.get("overhead_share") is None else f"{100 * r['overhead_share']:.0f} %",
                        mib(r.get("peak_worker_bytes")),
                        dominated_by(r, rs) or "–",
                        r.get("status", "ok"),
                    ]
                    for r in rs
                ],
            )
        )
        lines.append("")
    lines += [f"![QE against time for every data set]({plot(_plot_tables, by_data, f'{suite}_tables.png')})", ""]
    return lines


# the methods users would pick instead of ours: an algorithm of ours is dominated when one of them is both
# faster and better on the same data
PEERS = ("scikit-learn", "faiss")


def dominated_by(row, rows):
    """The first peer row (``PEERS``) of ``rows`` both faster than ``row`` and at a lower QE, or None (also for a
    peer's own row and for a row without figures)."""
    if row["tool"] in PEERS or "qe" not in row or "wall_s" not in row:
        return None
    return next(
        (
            r["algo"]
            for r in rows
            if r["tool"] in PEERS
            and "qe" in r
            and "wall_s" in r
            and r["wall_s"] < row["wall_s"]
            and r["qe"] < row["qe"]
        ),
        None,
    )


def vcgmm_section(rows, plot):
    t = of(rows, "vcgmm_table")
    if not t:
        return []
    lines = [
        "## vc-GMM: Table 1 and Fig. 1 analog",
        "",
        "η against scikit-learn's k-means++ (mean ± SEM over seeds), speedup in wall time (median over "
        "seeds) and in distance evaluations (against our own k-means++ Lloyd, which counts them), both from "
        "the same run. vc-GMM and LWCS on N′ rows; AFK-MC2 alone is its seeding without Lloyd.",
        "",
    ]
    by = defaultdict(lambda: defaultdict(list))
    for r in t:
        by[(r["data"], r["n"], r["d"], r["k"], r["coreset_size"])][r["algo"]].append(r)
    for (name, n, d, k, n_prime), algos in by.items():
        evals_base = [r.get("distance_evals") for r in algos.get("k-means++ (ours)", [])]
        base_evals = statistics.median(evals_base) if evals_base and None not in evals_base else None
        out = []
        for algo, rs in algos.items():
            etas = [r["eta"] for r in rs if r.get("eta") is not None]
            mean = statistics.mean(etas) if etas else None
            sem = statistics.stdev(etas) / math.sqrt(len(etas)) if len(etas) > 1 else None
            ev = [r["distance_evals"] for r in rs if r.get("distance_evals")]
            speeds = [r["speedup"] for r in rs if r.get("speedup")]
            share = [s for s in map(_setup_share, rs) if s is not None]
            eta = "–" if mean is None else f"{100 * mean:+.2f} %" + ("" if sem is None else f" ± {100 * sem:.2f}")
            out.append(
                [
                    algo,
                    len(rs),
                    eta,
                    times(statistics.median(speeds)) if speeds else "–",
                    times(base_evals / statistics.median(ev)) if base_evals and ev else "–",
                    fmt(statistics.median([r.get("n_iter") or 0 for r in rs]), ".1f"),
                    f"{100 * statistics.mean(share):.0f} %" if share else "–",
                ]
            )
        lines += [
            f"### {name} ({n:,} × {d}, C = {k}, N′ = {n_prime:,})",
            "",
            table(
                [
                    "algorithm",
                    "seeds",
                    "η ± SEM",
                    "speedup (time)",
                    "speedup (distances)",
                    "iterations",
                    "coreset + seeding share",
                ],
                out,
            ),
            "",
        ]
    lines += ["The paper's Table 1 (for comparison; other data, one thread per run):", "", PAPER_VCGMM, ""]
    trade = of(rows, "tradeoff")
    if trade:
        lines += [f"![η against speedup over coreset sizes]({plot(_plot_tradeoff, trade, 'vcgmm_tradeoff.png')})", ""]
    return lines


def _setup_share(r):
    ph = (r.get("extras") or {}).get("phase_s")
    if not ph or not r.get("wall_s"):
        return None
    return (ph.get("coreset", 0) + ph.get("seeding", 0)) / r["wall_s"]


def nmbatch_section(rows, plot):
    curves = of(rows, "curve")
    if not curves:
        return []
    best = min(p[1] for c in curves for p in c["points"])
    out = []
    for c in curves:
        rel = [(t, e / best - 1) for t, e in c["points"]]
        reach = {g: next((t for t, v in rel if v <= g), None) for g in (0.02, 0.01)}
        out.append(
            [
                c["tool"],
                c["algo"],
                fmt(reach[0.02]),
                fmt(reach[0.01]),
                pct(rel[-1][1]),
                fmt(rel[-1][0]),
                c.get("n_iter"),
            ]
        )
    lloyd = next((c for c in curves if c["algo"] == "lloyd"), None)
    ratio = []
    if lloyd:
        for c in curves:
            for g in (0.02, 0.01):
                a = next((t for t, e in lloyd["points"] if e / best - 1 <= g), None)
                b = next((t for t, e in c["points"] if e / best - 1 <= g), None)
                if a and b and c is not lloyd:
                    ratio.append(f"{c['algo']} reaches {100 * g:.0f} % of E* {a / b:.1f}× sooner than Lloyd")
    c0 = curves[0]
    return [
        "## Nested mini-batch k-means: Fig. 2 analog",
        "",
        f"{c0['data']}: {c0['n_train']:,} training and {c0['n_validation']:,} validation rows, k = {c0['k']}; "
        "the paper's protocol (shuffle, first k rows as centres, b0 = 5,000, ρ = 100). E* is the lowest "
        "validation energy reached by any method here; times exclude the energy evaluations.",
        "",
        table(["tool", "method", "s to 2 % of E*", "s to 1 % of E*", "final vs E*", "total s", "rounds"], out),
        "",
        "; ".join(ratio) + ("." if ratio else ""),
        "",
        f"![validation energy against time]({plot(_plot_curves, (curves, best), 'nmbatch_fig2.png')})",
        "",
        "The paper:",
        "",
        PAPER_NMBATCH,
        "",
    ]


def vrkm_section(rows):
    t = of(rows, "vrkm_table")
    if not t:
        return []
    lines = [
        "## VRKM: Table 3 analog",
        "",
        "Every method from the same k-means++ centres; time to reach batch k-means' (our Lloyd's) final loss, "
        "speedup = Lloyd's time to its own final loss / that time, and the final loss. Lloyd and VRKM report "
        "the full-data loss per iteration; the mini-batch methods only at the end.",
        "",
    ]
    by = defaultdict(list)
    for r in t:
        by[(r["data"], r["n"], r["d"], r["k"])].append(r)
    for (name, n, d, k), rs in by.items():
        base = next((r["time_to_batch_loss_s"] for r in rs if r["algo"] == "batch KM"), None)
        lines += [
            f"### {name} ({n:,} × {d}, K = {k})",
            "",
            table(
                ["method", "wall s", "s to batch loss", "speedup", "final loss", "iterations / epochs"],
                [
                    [
                        r["algo"],
                        fmt(r["wall_s"]),
                        fmt(r["time_to_batch_loss_s"]),
                        times(base / r["time_to_batch_loss_s"]) if base and r["time_to_batch_loss_s"] else "–",
                        fmt(r["loss"], ".7g"),
                        r["n_iter"],
                    ]
                    for r in rs
                ],
            ),
            "",
        ]
    return lines + ["The paper:", "", PAPER_VRKM, ""]


def sbe_section(rows, plot):
    iris, t784 = of(rows, "sbe_iris"), of(rows, "sbe_784")
    lines = []
    if iris:
        good, stuck = paper.iris_counts(iris)
        lines += [
            "## SBE: Iris and 784-d analogs",
            "",
            f"Iris, k = 3, {len(iris)} runs from 3 random rows (batch 30, (100, 10), step 1.0, decay 0.95): "
            f"SBE ends at the global minimum (f in [0.2628, 0.2640]) in {good}/{len(iris)} runs; Lloyd from "
            f"the same starts stops near 0.48 in {stuck}/{len(iris)}.",
            "",
            f"![final objective of SBE and Lloyd on Iris]({plot(_plot_iris, iris, 'sbe_iris.png')})",
            "",
        ]
    if t784:
        by = defaultdict(lambda: defaultdict(list))
        for r in t784:
            by[r["k"]][r["algo"]].append(r["f"])
        out = [
            [k, algo, f"{min(v):.2f} / {max(v):.2f} / {statistics.mean(v):.2f}", len(v)]
            for k, algos in sorted(by.items())
            for algo, v in algos.items()
        ]
        lines += [
            "784-d digit-like data (`datasets.make_digitlike`: 8 smooth random centres + noise, f = 15.68 at "
            "the centres; the paper used real MNIST digits as centres):",
            "",
            table(["k", "method", "f min / max / mean", "runs"], out),
            "",
            "The paper:",
            "",
            PAPER_SBE,
            "",
        ]
    return lines


def slk_section(rows):
    """Mean NMI / ACC per set and method over the seeds, with the authors' program's means beside them."""
    rows = of(rows, "slk_quality")
    if not rows:
        return []
    by = defaultdict(list)
    for r in rows:
        by[(r["data"], r["n"], r["d"], r["k"], r["algo"])].append(r)
    out = []
    for (data, n, d, k, algo), rs in by.items():
        theirs = PAPER_SLK.get((data, algo))
        out.append(
            [
                f"{data} ({n:,} × {d}, K = {k})",
                algo,
                len(rs),
                f"{statistics.mean(r['nmi'] for r in rs):.3f}",
                f"{statistics.mean(r['acc'] for r in rs):.3f}",
                sum(r["lost"] for r in rs),
                f"{statistics.median(r['wall_s'] for r in rs):.2f}",
                "–" if theirs is None else f"{theirs[0]:.3f} / {theirs[1]:.3f}",
            ]
        )
    return [
        "## SLK: NMI and ACC on the authors' sets",
        "",
        "Scalable Laplacian K-modes (Ziko, Granger, Ben Ayed) from our k-means++ seeds (`random_state` 0, 1, …), "
        "λ = 1.3, σ from the 4-NN graph of the L2-normalised rows, in-process; k-means++ Lloyd (ours) on the "
        "same normalised rows, same seeds. mnist5k is shuffled (its file is sorted by label). Lost: runs that "
        "lost a cluster (the previous iteration's model is kept).",
        "",
        table(["data", "method", "seeds", "NMI", "ACC", "lost", "median wall s", "authors' NMI / ACC"], out),
        "",
        "The authors' column: their program run on this project's machine from its own k-means++ seeds "
        "(issue #18); not divided into ours.",
        "",
    ]


def scaling_section(rows, plot):
    strong, over = of(rows, "strong"), of(rows, "overhead")
    if not strong and not over:
        return []
    lines = [f"## Scaling (`{COMMAND.format(suite='scaling')}`)", ""]
    if strong:
        by = defaultdict(dict)
        for r in strong:
            by[(r["data"], r["algo"], r["k"])][r["workers"]] = r
        out = []
        for (name, algo, k), w in by.items():
            one, two = w.get(1), w.get(2)
            out.append(
                [
                    name,
                    algo,
                    k,
                    fmt(one and one["wall_s"]),
                    fmt(two and two["wall_s"]),
                    times(one["wall_s"] / two["wall_s"]) if one and two else "–",
                    fmt(one and one["s_per_iter"]),
                    fmt(two and two["s_per_iter"]),
                ]
            )
        lines += [
            "Strong scaling on this machine, 1 → 2 single-thread workers:",
            "",
            table(["data", "algorithm", "k", "1 worker s", "2 workers s", "speedup", "s/iter (1)", "s/iter (2)"], out),
            "",
        ]
    if over:
        base = over[0]["overhead_ms"]
        lines += [
            "The engine against the number of single-thread worker processes, one real partition (two "
            "chunks) each, all on this machine: one empty iteration (median), the driver's CPU per round "
            "trip, and the bytes the driver process reads and writes per Lloyd iteration (k = 256, d = 32; "
            "counted on its sockets, heartbeats included):",
            "",
            table(
                ["workers", "ms per empty iteration", "vs first row", "driver CPU ms", "Lloyd kB in", "Lloyd kB out"],
                [
                    [
                        r["workers"],
                        f"{r['overhead_ms']:.1f}",
                        times(r["overhead_ms"] / base),
                        fmt(r.get("driver_cpu_ms")),
                        fmt(r.get("lloyd_bytes_in") and r["lloyd_bytes_in"] / 1e3),
                        fmt(r.get("lloyd_bytes_out") and r["lloyd_bytes_out"] / 1e3),
                    ]
                    for r in over
                ],
            ),
            "",
            f"![overhead per iteration against workers]({plot(_plot_overhead, over, 'scaling_overhead.png')})",
            "",
        ]
    return lines


def streaming_section(rows):
    """Streamed fits beyond the cluster's memory: passes, time per pass against one cold read and decode of the
    store, worker peaks against the limit."""
    rows = of(rows, "streaming")
    if not rows:
        return []
    r0 = rows[0]
    lines = [
        f"## Beyond memory (`{COMMAND.format(suite='streaming')}`)",
        "",
        f"Zarr stores of 32-d float32 blobs (30 MiB chunks, fitted in 32 MiB chunks) on {r0['workers']} workers of "
        f"{mib(r0['worker_limit'])} MiB each; passes = stored bytes decoded ÷ the store's size; the floor is one "
        f"{'cold' if r0['cold'] else 'warm'} read and decode of the whole store on the same workers, in the same run.",
        "",
    ]
    body = []
    for r in rows:
        body.append(
            [
                f"{r['times_memory']:g}×",
                f"{r['data_bytes'] / 2**30:.2f}",
                r["algo"],
                ", ".join(f"{k}={v}" for k, v in r["params"].items()),
                r["outcome"] if r["outcome"] == "fitted" else r["outcome"][:80],
                "files" if r["state_files"] else "memory",
                fmt(r["passes"], ".2f"),
                fmt(r["wall_s"], ".0f"),
                fmt(r["floor_pass_s"], ".1f"),
                times(r["pass_vs_floor"]),
                f"{mib(r['peak_worker_bytes'])} ({100 * r['peak_of_limit']:.0f} %)" if r["peak_of_limit"] else "–",
                r["pausing_events"],
            ]
        )
    header = [
        "store ÷ memory",
        "GiB",
        "fit",
        "parameters",
        "outcome",
        "state",
        "passes",
        "wall s",
        "floor s",
        "s a pass ÷ floor",
        "worker peak MiB (of limit)",
        "pauses",
    ]
    return lines + [table(header, body), ""]


def sweep_section(rows, plot):
    """Time against C (``--suite sweep``): every fit's wall time, its speedup and eta against scikit-learn's
    k-means++ Lloyd of the same C (speedup only where scikit-learn's time is extrapolated) and its QE against
    faiss's; vc-GMM's seeding share and the growth of its fit, final pass aside, over the C range."""
    rows = of(rows, "sweep")
    if not rows:
        return []
    by_c = defaultdict(dict)
    for r in rows:
        by_c[r["k"]][r["algo"]] = r
    out = []
    for C in sorted(by_c):
        faiss = by_c[C].get("faiss", {})
        for algo, r in by_c[C].items():
            wall = r.get("wall_s")
            shown = "–" if wall is None else f"{wall:.3g}" + (" (extrapolated)" if r.get("extrapolated") else "")
            vs_faiss = r["qe"] / faiss["qe"] - 1 if r.get("qe") and faiss.get("qe") else None
            phases = (r.get("extras") or {}).get("phase_s") or {}
            seeding = phases.get("seeding") / wall if wall and "seeding" in phases else None
            out.append(
                [
                    C,
                    algo,
                    shown if "status" not in r else r["status"],
                    times(r.get("speedup")),
                    pct(r.get("eta")),
                    pct(vs_faiss),
                    fmt(r.get("distance_evals")),
                    "–" if seeding is None else f"{100 * seeding:.0f} %",
                ]
            )
    first = rows[0]
    lines = [
        f"## Time against the number of clusters (`{COMMAND.format(suite='sweep')}`)",
        "",
        f"{first['data']} ({first['n']:,} × {first['d']}), one seed, every library on this machine's cores. "
        "Speedup and η against scikit-learn's k-means++ Lloyd of the same C; where it does not finish within "
        "its cap, its time is its time per iteration at that C times its iteration count at the largest C it "
        "finished (its seeding left out: a lower bound), and there is no η. QE against faiss: our QE over "
        "faiss's, minus 1.",
        "",
        table(["C", "fit", "wall s", "speedup", "η", "QE vs faiss", "distance evaluations", "seeding"], out),
        "",
    ]
    vc = {C: by_c[C]["vcgmm"] for C in by_c if by_c[C].get("vcgmm", {}).get("wall_s")}
    if len(vc) > 1:
        lo, hi = min(vc), max(vc)
        net = {
            C: vc[C]["wall_s"] - ((vc[C].get("extras") or {}).get("phase_s") or {}).get("final_qe", 0.0)
            for C in (lo, hi)
        }
        lines += [
            f"vc-GMM without its final pass: {net[lo]:.3g} s at C = {lo:,}, {net[hi]:.3g} s at C = {hi:,} "
            f"({times(net[hi] / net[lo])} for {times(hi / lo)} the clusters).",
            "",
        ]
    lines += [f"![wall time against C]({plot(_plot_sweep, by_c, 'sweep_time.png')})", ""]
    return lines


def headline(runs):
    """The ratios the README quotes, from the paper suite's table rows of the largest real data set."""
    rows = of(runs.get("paper", []) or runs.get("quick", []), "table")
    real = [
        r
        for r in rows
        if r["data"] == "imgpatches" and r.get("speedup") and r["seed"] == 0 and r["tool"] == "dask_clust"
    ]
    return sorted(real, key=lambda r: -r["speedup"])[:3]


def faiss_versus(runs):
    """Per data set and k of the suites' tables and of the C sweep (seed 0): faiss's k-means against our
    Lloyd and vc-GMM of the same run, as (data, k, algo, faiss wall / ours, our QE / faiss's − 1)."""
    out = []
    for suite, kind in (("paper", "table"), ("quick", "table"), ("sweep", "sweep")):
        rows = [r for r in of(runs.get(suite, []), kind) if r["seed"] == 0]
        for data, k in dict.fromkeys((r["data"], r["k"]) for r in rows):
            fa = next(
                (r for r in rows if (r["data"], r["k"]) == (data, k) and r["algo"] == "faiss" and r.get("wall_s")), None
            )
            for r in rows:
                if (
                    fa
                    and (r["data"], r["k"]) == (data, k)
                    and r["tool"] == "dask_clust"
                    and r["algo"] in ("kmeans", "vcgmm")
                    and r.get("wall_s")
                    and r.get("qe")
                ):
                    out.append((data, k, r["algo"], fa["wall_s"] / r["wall_s"], r["qe"] / fa["qe"] - 1))
    return out


def faiss_sentence(runs):
    """The headline's second sentence: where faiss's default k-means beats us, said plainly."""
    vs = faiss_versus(runs)
    if not vs:
        return None
    lose = [
        f"{algo} on {data} (k = {k}: faiss {times(1 / ratio)} faster)" for data, k, algo, ratio, _ in vs if ratio < 1
    ]
    win = [f"{algo} on {data} (k = {k}: {times(ratio)} faster)" for data, k, algo, ratio, _ in vs if ratio >= 1]
    worse = [f"{algo} on {data} (k = {k}: {pct(eta)})" for data, k, algo, _, eta in vs if eta > 0.03]
    better = [f"{algo} on {data} (k = {k}: {pct(eta)})" for data, k, algo, _, eta in vs if eta < -0.03]
    return (
        f"Against faiss's k-means with its defaults (same run, its own threads): "
        f"faster in {sum(r >= 1 for *_, r, _ in vs)} "
        f"of {len(vs)} Lloyd and vc-GMM fits. Faster: {'; '.join(win) or 'none'}. Slower: {'; '.join(lose) or 'none'}. "
        f"QE more than 3 % above "
        f"faiss's: {'; '.join(worse) or 'none'}; more than 3 % below: {'; '.join(better) or 'none'}."
    )


# ------------------------------------------------------------------ plots


def _plot_tables(fig, by_data):
    n = len(by_data)
    cols = min(3, n)
    axes = fig.subplots(math.ceil(n / cols), cols, squeeze=False).ravel()
    for ax, ((name, k, _, _), rs) in zip(axes, by_data.items()):
        for r in rs:
            if r.get("wall_s") and r.get("eta") is not None:
                ax.scatter(r["wall_s"], 100 * r["eta"], s=18, color="C0" if r["tool"] == "dask_clust" else "C3")
                ax.annotate(
                    r["algo"], (r["wall_s"], 100 * r["eta"]), fontsize=6, xytext=(3, 2), textcoords="offset points"
                )
        ax.set_xscale("log")
        ax.set_title(f"{name}, k = {k}", fontsize=9)
        ax.set_xlabel("wall time (s)")
        ax.set_ylabel("QE vs scikit-learn k-means++ (%)")
    for ax in axes[n:]:
        ax.axis("off")
    fig.suptitle("blue: dask_clust, red: other libraries", fontsize=9)


def _plot_tradeoff(fig, trade):
    ax = fig.subplots()
    for label, marker in (("vc-GMM", "o"), ("LWCS k-means", "s"), ("AFK-MC2", "^"), ("var-GMM-S", "D")):
        pts = [(r["speedup"], 100 * r["eta"], r) for r in trade if r["algo"] == label and r.get("speedup")]
        if not pts:
            continue
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=label)
        for s, e, r in pts:
            tag = r.get("coreset_size") or r.get("chain_length") or r.get("G")
            ax.annotate(
                f"2^{int(math.log2(tag))}" if label in ("vc-GMM", "LWCS k-means") else str(tag),
                (s, e),
                fontsize=7,
                xytext=(3, 3),
                textcoords="offset points",
            )
    ax.set_xscale("log")
    ax.set_xlabel("speedup in wall time vs scikit-learn k-means++ (same run)")
    ax.set_ylabel("QE increase η (%)")
    ax.set_title(f"{trade[0]['data']}, C = {trade[0]['k']}: labels are N′, chain length m, or G")
    ax.legend()


def _plot_curves(fig, arg):
    curves, best = arg
    ax = fig.subplots()
    for c in curves:
        pts = [(t, e / best - 1) for t, e in c["points"] if t > 0]
        label = c["algo"] if c["tool"] in c["algo"] else f"{c['algo']} ({c['tool']})"
        ax.plot([p[0] for p in pts], [max(p[1], 1e-5) for p in pts], label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.axhline(0.01, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("time (s, energy evaluations excluded)")
    ax.set_ylabel("(E_validation − E*) / E*")
    ax.set_title(f"{curves[0]['data']}, k = {curves[0]['k']}")
    ax.legend()


def _plot_iris(fig, iris):
    ax = fig.subplots()
    bins = [0.26 + 0.005 * i for i in range(50)]
    ax.hist([r["f_sbe"] for r in iris], bins=bins, alpha=0.7, label="SBE")
    ax.hist([r["f_lloyd"] for r in iris], bins=bins, alpha=0.7, label="Lloyd, same starts")
    ax.set_xlabel("final f = QE / 2N")
    ax.set_ylabel("runs")
    ax.set_title(f"Iris, k = 3, {len(iris)} runs")
    ax.legend()


def _plot_sweep(fig, by_c):
    ax = fig.subplots()
    for algo in sorted({a for fits in by_c.values() for a in fits}):
        pts = sorted(
            (C, fits[algo]["wall_s"], bool(fits[algo].get("extrapolated")))
            for C, fits in by_c.items()
            if fits.get(algo, {}).get("wall_s")
        )
        if not pts:
            continue
        (line,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=algo)
        gone = [p for p in pts if p[2]]
        if gone:  # extrapolated points: hollow
            ax.plot([p[0] for p in gone], [p[1] for p in gone], "o", mfc="white", color=line.get_color())
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("clusters C")
    ax.set_ylabel("wall time, s")
    ax.set_title("time against C (hollow: extrapolated)")
    ax.legend(fontsize=8)


def _plot_overhead(fig, over):
    ax = fig.subplots()
    ax.plot([r["workers"] for r in over], [r["overhead_ms"] for r in over], marker="o")
    ax.set_xlabel("worker processes")
    ax.set_ylabel("ms per empty iteration")
    ax.set_title("driver overhead per iteration")


# ------------------------------------------------------------------ the page


def write(results_dir, page, tiny=False):
    """Render ``page`` (BENCHMARKS.md) and its PNGs into ``results_dir`` from the suites' latest runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = read_rows(results_dir, tiny)
    rel = os.path.relpath(results_dir, os.path.dirname(os.path.abspath(page)))

    def plot(draw, data, name):
        fig = plt.figure(figsize=(10, 7) if draw is _plot_tables else (7, 4.5))
        draw(fig, data)
        fig.tight_layout()
        fig.savefig(os.path.join(results_dir, name), dpi=110)
        plt.close(fig)
        return f"{rel}/{name}"

    lines = [
        "# Benchmarks",
        "",
        "Generated by `python benchmarks/run.py` from the JSON lines in `benchmarks/results/suite-*.jsonl`, "
        "down to the per-issue scripts' sections at the end, which are written by hand from their runs and "
        "kept as they are. Regenerate a suite (and this page) with the command in its section; `python "
        "benchmarks/run.py --report` only rewrites the page. Which function measured each figure: "
        "`benchmarks/README.md`.",
        "",
    ]
    top = headline(runs)
    if top:
        lines += [
            "Headline (image patches, 1.39 M × 108): "
            + "; ".join(
                f"{r['algo']} {times(r['speedup'])} faster than scikit-learn k-means++ at {pct(r['eta'])} QE"
                for r in top
            )
            + ".",
            "",
        ]
    against = faiss_sentence(runs)
    if against:
        lines += [against, ""]
    lines += machine_section(runs)
    for suite in ("paper", "quick"):
        if suite in runs:
            lines += tables_section(suite, runs[suite], plot)
    paper_rows = runs.get("paper", [])
    lines += vcgmm_section(paper_rows, plot)
    lines += nmbatch_section(paper_rows, plot)
    lines += vrkm_section(paper_rows)
    lines += sbe_section(paper_rows, plot)
    lines += slk_section(of(paper_rows, "slk_quality") or runs.get("quick", []))
    lines += sweep_section(runs.get("sweep", []), plot)
    lines += scaling_section(runs.get("scaling", []), plot)
    lines += streaming_section(runs.get("streaming", []))
    while lines and not lines[-1]:
        lines.pop()
    lines += kept_by_hand(page)
    with open(page, "w") as f:
        f.write("\n".join(lines).rstrip() + "\n")
    return page


# where the page's hand-written part starts: the per-issue scripts' figures, kept as they are
BY_HAND = "<!-- by hand from here on: the per-issue scripts' figures (each section names its command) -->"


def kept_by_hand(page):
    """The lines of ``page`` from the BY_HAND marker on (none when it has no marker)."""
    if not os.path.exists(page):
        return []
    with open(page) as f:
        text = f.read()
    return ["", *text[text.index(BY_HAND) :].rstrip().split("\n")] if BY_HAND in text else []
