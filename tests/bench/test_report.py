"""The bench report tells the truth: keeps-up by a stated stall threshold, negative A/B not shown as a
number, a column of a missing optional package hidden, titles on both plots."""

from __future__ import annotations

from lmdata.bench import report
from lmdata.bench.run import KEEP_UP_STALL


def _result(memory: dict, stall_ab: float) -> dict:
    run = {"cache": "warm", "resident_before": 1.0, "format": "lance", "workers": 0, "stall_fraction": 0.4,
           "stall_ab": stall_ab, "wait_ms_p50": 1.0, "wait_ms_p95": 2.0, "wait_ms_p99": 3.0, "wait_ms_max": 4.0,
           "first_batch_ms": 5.0, "loader_tokens_per_s": 2e6, "headroom": 1.3, "keeps_up": False, "memory": memory,
           "wait_ms": [1.0, 2.0, 3.0]}
    config = {"store": "/x/runs/sample-store", "split": "train", "batch_size": 16, "seq_len": 256, "steps_run": 3,
              "compute": "simulated", "step_ms": 23.0, "prefetch": 2, "model": "small", "device": "cpu"}
    return {"config": config, "runs": [run], "machine": {"cpus": 2, "loadavg_1m_at_start": 1.0},
            "consume_tokens_per_s": 1.5e6}


def test_uss_column_only_with_psutil():
    without = report.table(_result({"workers_rss_mb": 10.0}, 0.1))
    assert "USS MB" not in without and "workers RSS MB" in without
    assert "USS MB" in report.table(_result({"workers_rss_mb": 10.0, "workers_uss_mb": 3.0}, 0.1))


def test_negative_ab_is_not_a_number_and_is_explained():
    row = report.table(_result({}, -0.07)).splitlines()[1]
    assert "-7.0%" not in row and " - " in f" {row} "
    assert any("faster than the synthetic" in line for line in report.notes(_result({}, -0.07)))
    assert any(f"{KEEP_UP_STALL:.0%}" in line for line in report.notes(_result({}, 0.1)))


def test_both_plots_have_a_title_that_fits(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seen = []
    real = plt.Figure.savefig

    def spy(fig, *a, **kw):
        fig.canvas.draw()
        box = fig._suptitle.get_window_extent()
        w, h = fig.canvas.get_width_height()
        seen.append((fig._suptitle.get_text(), box.x0 >= 0 and box.x1 <= w and box.y1 <= h))
        return real(fig, *a, **kw)

    plt.Figure.savefig = spy
    try:
        report.plot_stall(_result({}, 0.1), tmp_path / "stall.png")
        report.plot_waits(_result({}, 0.1), tmp_path / "waits.png")
    finally:
        plt.Figure.savefig = real
    assert [t.splitlines()[0] for t, _ in seen] == ["Stall fraction per format and loader workers",
                                                      "Loader wait per step (CDF)"]
    assert all(fits for _, fits in seen), seen
