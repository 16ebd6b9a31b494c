"""A run's ε curve as inline SVG, drawn on the server: no script, no plotting library.

The same step curve as ``vesper status --plot`` (ε after each counted charge, in ledger
order, held flat over uncounted charges), with the budget as a dashed line. An infinite ε
(non-private releases) is drawn at the top edge and said in words.
"""

from __future__ import annotations

import math
from html import escape

from vesper.common.privacy.ledger import RunStatusView


def format_epsilon(value: float | None) -> str:
    """How every ε and δ on the dashboard is written: 6 significant digits, ∞ for infinity."""
    if value is None:
        return "–"
    if math.isinf(value):
        return "∞" if value > 0 else "−∞"
    if math.isnan(value):
        return "NaN"
    return f"{value:.6g}"


def curve_points(view: RunStatusView) -> list[tuple[int, float]]:
    """(charges so far, ε) after each counted charge, from (0, 0) to the last charge."""
    points = [(0, 0.0)] + [(point.seq + 1, point.epsilon) for point in view.epsilon_curve]
    if view.charges > points[-1][0]:
        points.append((view.charges, points[-1][1]))  # uncounted charges after the last counted one
    return points


def _step_path(points: list[tuple[float, float]]) -> str:
    """A polyline's points for a step plot: each value held until the next x."""
    steps: list[tuple[float, float]] = []
    for index, (x, y) in enumerate(points):
        if index:
            steps.append((x, steps[-1][1]))
        steps.append((x, y))
    return " ".join(f"{x:.1f},{y:.1f}" for x, y in steps)


def epsilon_curve_svg(view: RunStatusView, width: int = 320, height: int = 120) -> str:
    """An ``<svg>`` of the run's ε curve and budget, ``width`` × ``height`` pixels."""
    points = curve_points(view)
    finite = [eps for _, eps in points if math.isfinite(eps)]
    top = max(finite + ([view.epsilon_budget] if math.isfinite(view.epsilon_budget) else []) + [1e-12])
    top *= 1.08
    last_x = max(points[-1][0], 1)
    left, right, upper, lower = 44, 8, 8, 18
    plot_w, plot_h = width - left - right, height - upper - lower

    def place(x: float, eps: float) -> tuple[float, float]:
        y = upper if not math.isfinite(eps) else upper + plot_h * (1 - eps / top)
        return left + plot_w * x / last_x, y

    label = (
        f"ε of run {view.run_id} after {view.charges} charges: {format_epsilon(view.epsilon_spent)} "
        f"of a budget of {format_epsilon(view.epsilon_budget)}"
    )
    parts = [
        f'<svg class="eps-curve" role="img" aria-label="{escape(label)}" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(label)}</title>",
        f'<rect x="{left}" y="{upper}" width="{plot_w}" height="{plot_h}" class="plot-area"/>',
        f'<text x="{left - 4}" y="{upper + 4}" class="axis" text-anchor="end">{escape(format_epsilon(top))}</text>',
        f'<text x="{left - 4}" y="{upper + plot_h}" class="axis" text-anchor="end">0</text>',
        f'<text x="{left + plot_w}" y="{height - 4}" class="axis" text-anchor="end">{points[-1][0]} '
        f'{"charge" if points[-1][0] == 1 else "charges"}</text>',
    ]
    if math.isfinite(view.epsilon_budget):
        _, budget_y = place(0, view.epsilon_budget)
        parts.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{budget_y:.1f}" y2="{budget_y:.1f}" class="budget-line"/>'
            f'<text x="{left + 4}" y="{budget_y - 3:.1f}" class="axis budget-text">budget '
            f"{escape(format_epsilon(view.epsilon_budget))}</text>"
        )
    parts.append(f'<polyline points="{_step_path([place(x, eps) for x, eps in points])}" class="eps-line"/>')
    if len(finite) < len(points):
        parts.append(
            f'<text x="{left + plot_w / 2:.1f}" y="{upper + plot_h / 2:.1f}" class="axis infinite" '
            'text-anchor="middle">ε = ∞ (non-private releases)</text>'
        )
    parts.append("</svg>")
    return "".join(parts)
