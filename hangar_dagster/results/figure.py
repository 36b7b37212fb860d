"""The report's one picture, as PNG bytes: matplotlib on its Agg backend (no display, no browser).

Left: one bar per variant, its pass rate in points with its 95% interval. Right: each variant's
paired difference against the baseline with its 95% interval, the zero line and the decision
threshold (decide.min_effect_pts). matplotlib is imported here only, when a report is written:
the CLI and the definitions do not pay for it. docs/report.md says why matplotlib.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hangar_dagster.results.report import Report

BAR = "#4c72b0"
BASE = "#8c8c8c"


def figure_png(report: Report, dpi: int = 110) -> bytes:
    import matplotlib

    matplotlib.use("Agg", force=True)  # before pyplot: never a GUI backend
    import matplotlib.pyplot as plt

    names = [v.name for v in report.variants]
    rated = [v for v in report.variants if v.rate is not None]
    compared = [v for v in report.variants if v.difference is not None]
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(10, 4.2), gridspec_kw={"width_ratios": [3, 2]}, layout="constrained"
    )
    try:
        xs = [names.index(v.name) for v in rated]
        pts = [v.rate.pts for v in rated if v.rate]
        # max(0, ...): at 0 or 100 pts Wilson's bound sits a rounding error past the rate,
        # and matplotlib refuses a negative error bar
        low = [max(0.0, v.rate.pts - v.rate.low_pts) for v in rated if v.rate]
        high = [max(0.0, v.rate.high_pts - v.rate.pts) for v in rated if v.rate]
        colors = [BASE if v.is_baseline else BAR for v in rated]
        left.bar(xs, pts, color=colors, yerr=[low, high], capsize=6, ecolor="#222")
        for x, v in zip(xs, rated, strict=True):
            assert v.rate is not None
            left.annotate(
                f"{v.rate.pts:.1f}\n{v.rate.n_tasks} tasks, {v.rate.n_trials} trials",
                (x, v.rate.high_pts),
                textcoords="offset points",
                xytext=(0, 4),
                ha="center",
                fontsize=8,
            )
        left.set_xticks(range(len(names)), names)
        left.set_ylim(0, 112)
        left.set_yticks(range(0, 101, 20))
        left.set_ylabel("pass rate, points out of 100")
        left.set_title("pass rate per variant (95% CI, clustered by task)", fontsize=10)

        if compared:
            ys = list(range(len(compared)))
            d = [v.difference for v in compared if v.difference]
            right.errorbar(
                [x.pts for x in d],
                ys,
                xerr=[
                    [max(0.0, x.pts - x.low_pts) for x in d],
                    [max(0.0, x.high_pts - x.pts) for x in d],
                ],
                fmt="o",
                color=BAR,
                capsize=6,
            )
            right.set_yticks(ys, [f"{v.name} - {report.baseline}" for v in compared])
            for y, diff in zip(ys, d, strict=True):
                right.annotate(
                    f"{diff.pts:+.1f} ({diff.n_tasks} tasks)",
                    (diff.pts, y),
                    textcoords="offset points",
                    xytext=(0, 8),
                    ha="center",
                    fontsize=8,
                )
            right.set_ylim(-0.8, len(compared) - 0.2)
        else:
            right.text(
                0.5,
                0.5,
                "no paired difference\n(no baseline, or nothing pairs)",
                ha="center",
                va="center",
                transform=right.transAxes,
                fontsize=9,
            )
            right.set_yticks([])
        right.axvline(0, color="#222", linewidth=0.8)
        if report.min_effect_pts is not None:
            right.axvline(report.min_effect_pts, color="#c44e52", linestyle="--", linewidth=1)
            right.annotate(
                f"sought: {report.min_effect_pts:g}",
                (report.min_effect_pts, 1.0),
                xycoords=("data", "axes fraction"),
                textcoords="offset points",
                xytext=(3, -12),
                color="#c44e52",
                fontsize=8,
            )
        right.set_xlim(-100, 100)
        right.set_xlabel("variant - baseline, points (95% CI, paired by task)", fontsize=9)
        right.set_title("paired difference and the decision threshold", fontsize=10)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=dpi)
        return buf.getvalue()
    finally:
        plt.close(fig)
