"""The benchmark harness: a smoke run of ``python benchmarks/run.py --suite quick --tiny`` (every algorithm and
competitor on 2,000 rows of each set, one repeat: that it runs and reports, not how fast), and the page's
arithmetic on rows whose answers are known."""

import json
import math
import statistics

import pytest

from dask_clust import algorithms
from harness import report
from harness.cli import main
from harness.suites import BASELINE, NOT_QE, QUICK_TABLES

# every test here starts processes (a cluster, its workers, a kernel): not in the fast tier
pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    results = tmp_path_factory.mktemp("results")
    page = results / "BENCHMARKS.md"
    assert main(["--suite", "quick", "--tiny", "--results", str(results), "--page", str(page), "--report"]) == 0
    rows = [json.loads(line) for line in (results / "suite-quick-tiny.jsonl").read_text().splitlines()]
    return rows, page, results


def test_quick_suite_fits_every_algorithm_on_every_set(smoke):
    rows, _, _ = smoke
    tables = [r for r in rows if r["kind"] == "table"]
    assert {r["data"] for r in tables} == {name for name, _ in QUICK_TABLES}
    for name, _ in QUICK_TABLES:
        ours = {r["algo"] for r in tables if r["data"] == name and r["tool"] == "dask_clust"}
        assert set(algorithms.REGISTRY) - set(NOT_QE) <= ours, name
    failed = [(r["data"], r["algo"], r["status"]) for r in tables if r["tool"] == "dask_clust" and "status" in r]
    assert failed == []
    assert all(r["n"] <= 2000 for r in tables)


def test_every_ratio_comes_from_rows_of_the_same_run(smoke):
    rows, _, _ = smoke
    assert len({r["run"] for r in rows}) == 1
    tables = [r for r in rows if r["kind"] == "table" and "qe" in r]
    for r in tables:
        (base,) = [b for b in tables if (b["data"], b["seed"], b["algo"]) == (r["data"], r["seed"], BASELINE)]
        assert r["eta"] == pytest.approx(r["qe"] / base["qe"] - 1, rel=1e-12, abs=1e-15)
        assert r["speedup"] == pytest.approx(base["wall_s"] / r["wall_s"], rel=1e-12)
        assert r["qe"] > 0 and r["wall_s"] > 0


def test_smoke_page_has_a_table_and_a_plot_per_set(smoke):
    _, page, results = smoke
    text = page.read_text()
    for name, _ in QUICK_TABLES:
        assert f"### {name} (" in text
    assert (results / "quick_tables.png").stat().st_size > 10_000
    assert "python benchmarks/run.py --suite quick" in text


def test_regenerating_the_page_keeps_what_was_written_by_hand_and_nothing_else(smoke):
    _, page, results = smoke
    generated = page.read_text()
    hand = f"{report.BY_HAND}\n\n## A per-issue section\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"
    page.write_text(generated.replace("## Machine", "## Machine (edited)") + "\n" + hand)
    assert main(["--tiny", "--results", str(results), "--page", str(page), "--report"]) == 0
    assert page.read_text() == generated.rstrip("\n") + "\n\n" + hand
    assert main(["--tiny", "--results", str(results), "--page", str(page), "--report"]) == 0
    assert page.read_text() == generated.rstrip("\n") + "\n\n" + hand


def _table_row(algo, eta, speedup, evals=None, seed=0, extras=None):
    return {
        "kind": "vcgmm_table",
        "run": "r",
        "data": "d",
        "n": 100,
        "d": 2,
        "k": 4,
        "coreset_size": 64,
        "seed": seed,
        "algo": algo,
        "eta": eta,
        "speedup": speedup,
        "distance_evals": evals,
        "n_iter": 3,
        "wall_s": 1.0,
        "extras": extras or {},
    }


def test_vcgmm_table_reports_mean_and_sem_of_eta_and_median_speedup():
    etas = [0.08, 0.10, 0.12]
    rows = [
        _table_row("vc-GMM", e, s, evals=1000 * (i + 1), seed=i) for i, (e, s) in enumerate(zip(etas, [90, 110, 100]))
    ]
    rows += [_table_row("k-means++ (ours)", 0.0, 1.0, evals=400_000, seed=i) for i in range(3)]
    text = "\n".join(report.vcgmm_section(rows, lambda *a: "x.png"))
    sem = statistics.stdev(etas) / math.sqrt(3)
    assert f"| vc-GMM | 3 | +10.00 % ± {100 * sem:.2f} | 100.0× | 200.0× |" in text  # 400,000 / median 2,000


def test_nmbatch_section_measures_time_to_within_one_and_two_percent_of_the_best():
    curve = {"kind": "curve", "data": "d", "n_train": 90, "n_validation": 10, "k": 5, "tool": "dask_clust"}
    rows = [
        {**curve, "algo": "lloyd", "points": [[1.0, 130.0], [2.0, 101.5], [4.0, 100.5], [8.0, 100.0]]},
        {**curve, "algo": "nmbatch", "points": [[0.1, 104.0], [0.2, 101.9], [0.4, 100.9]]},
    ]
    text = "\n".join(report.nmbatch_section(rows, lambda *a: "x.png"))
    assert "| dask_clust | nmbatch | 0.2 | 0.4 | +0.90 % | 0.4 |" in text
    assert "nmbatch reaches 2 % of E* 10.0× sooner than Lloyd" in text  # 2.0 s / 0.2 s
    assert "nmbatch reaches 1 % of E* 10.0× sooner than Lloyd" in text  # 4.0 s / 0.4 s


def test_quick_suite_scores_slk_labels_next_to_kmeans(smoke):
    """Issue #18: SLK-BO, SLK-MS and k-means++ on digits, mnist5k and segment, scored against the sets'
    labels (the smoke run's one seed on 2,000 rows: far above chance, 0.1 for 10 classes), and the page
    shows the table."""
    from harness.paper import SLK_SETS

    rows, page, _ = smoke
    slk = [r for r in rows if r["kind"] == "slk_quality"]
    assert {(r["data"], r["algo"]) for r in slk} == {
        (name, algo) for name, _, _ in SLK_SETS for algo in ("SLK-BO", "SLK-MS", "k-means++ (ours)")
    }
    assert all(0.3 < r["nmi"] <= 1 and 0.3 < r["acc"] <= 1 for r in slk if r["data"] != "segment"), slk
    assert all(0 < r["nmi"] <= 1 and 1 / 7 < r["acc"] <= 1 for r in slk), slk
    assert "## SLK: NMI and ACC on the authors' sets" in page.read_text()


def test_slk_section_reports_mean_scores_and_lost_runs():
    common = {"kind": "slk_quality", "data": "digits", "n": 1797, "d": 64, "k": 10}
    rows = [
        {**common, "seed": s, "algo": "SLK-BO", "nmi": nmi, "acc": a, "lost": lost, "wall_s": w}
        for s, (nmi, a, lost, w) in enumerate([(0.8, 0.7, False, 0.1), (0.7, 0.6, True, 0.3), (0.9, 0.8, False, 0.2)])
    ]
    text = "\n".join(report.slk_section(rows))
    assert "| digits (1,797 × 64, K = 10) | SLK-BO | 3 | 0.800 | 0.700 | 1 | 0.20 | 0.809 / 0.769 |" in text


def test_sweep_suite_runs_every_fit_at_every_c(tmp_path):
    """``--suite sweep --tiny``: every fit at both of the smoke run's C, each ratio against scikit-learn's row
    of the same C, and the page's section with its plot."""
    from harness.sweep import FITS, TINY_C

    page = tmp_path / "BENCHMARKS.md"
    assert main(["--suite", "sweep", "--tiny", "--results", str(tmp_path), "--page", str(page), "--report"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "suite-sweep-tiny.jsonl").read_text().splitlines()]
    sweep = [r for r in rows if r["kind"] == "sweep"]
    assert {(r["k"], r["algo"]) for r in sweep} == {(C, a) for C in TINY_C for a in FITS + (BASELINE, "faiss")}
    # faiss is in the bench extra, not the test extra: without it its rows say so, and only its rows
    import importlib.util

    absent = [] if importlib.util.find_spec("faiss") else ["not installed (faiss)"] * len(TINY_C)
    assert [r["status"] for r in sweep if "status" in r] == absent
    for r in (r for r in sweep if "status" not in r):
        (base,) = [b for b in sweep if (b["k"], b["algo"]) == (r["k"], BASELINE)]
        assert r["speedup"] == pytest.approx(base["wall_s"] / r["wall_s"], rel=1e-12)
        assert r["eta"] == pytest.approx(r["qe"] / base["qe"] - 1, rel=1e-12, abs=1e-15)
    assert "## Time against the number of clusters" in page.read_text()
    assert (tmp_path / "sweep_time.png").stat().st_size > 10_000


def test_sweep_section_extrapolated_baseline_gives_speedup_only():
    common = {"kind": "sweep", "data": "d", "n": 1000, "d": 2, "seed": 0}
    rows = [
        {**common, "k": 10, "algo": BASELINE, "wall_s": 100.0, "qe": 50.0, "speedup": 1.0, "eta": 0.0},
        {
            **common,
            "k": 10,
            "algo": "vcgmm",
            "wall_s": 2.0,
            "qe": 55.0,
            "speedup": 50.0,
            "eta": 0.1,
            "extras": {"phase_s": {"seeding": 0.5, "final_qe": 1.0}},
        },
        {**common, "k": 10, "algo": "faiss", "wall_s": 4.0, "qe": 50.0, "speedup": 25.0, "eta": 0.0},
        {**common, "k": 40, "algo": BASELINE, "wall_s": 400.0, "extrapolated": True, "n_iter": 30},
        {
            **common,
            "k": 40,
            "algo": "vcgmm",
            "wall_s": 4.0,
            "qe": 44.0,
            "speedup": 100.0,
            "eta": None,
            "extras": {"phase_s": {"seeding": 1.0, "final_qe": 1.0}},
        },
        {**common, "k": 40, "algo": "faiss", "wall_s": 8.0, "qe": 40.0, "speedup": 50.0, "eta": None},
    ]
    text = "\n".join(report.sweep_section(rows, lambda *a: "x.png"))
    assert "| 10 | vcgmm | 2 | 50.0× | +10.00 % | +10.00 % | – | 25 % |" in text
    assert "| 40 | sklearn-lloyd | 400 (extrapolated) | – | – | – | – | – |" in text
    assert "| 40 | vcgmm | 4 | 100.0× | – | +10.00 % | – | 25 % |" in text
    assert "vc-GMM without its final pass: 1 s at C = 10, 3 s at C = 40 (3.00× for 4.00× the clusters)." in text
