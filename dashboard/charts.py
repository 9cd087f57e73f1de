"""Server-rendered SVG charts: vertical bars, histograms and horizontal bars.

Pure functions from numbers and labels to a SafeString of ``<svg>``. Every piece of markup is built with
``format_html``, so a label that came from a model (a workflow, tool or agent name) is always escaped.
Looks come from classes in warden.css, never from ``style`` attributes (the CSP forbids inline styles).
Each chart carries a ``<title>``/``<desc>`` and a ``<title>`` tooltip per bar; the page puts a plain
table next to it for anyone the drawing does not serve.
"""

import math
from collections.abc import Callable, Sequence

from django.utils.html import conditional_escape, format_html
from django.utils.safestring import SafeString, mark_safe

from runs.selectors.insight import Bin

WIDTH, HEIGHT = 720, 260
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 34, 52  # margins: tick labels left, axis labels below
MAX_X_LABELS = 10


def nice_scale(peak: float | None, *, ticks: int = 4, integer: bool = False) -> tuple[float, float]:
    """The axis top and tick step for data whose largest value is ``peak``: a round step (1, 2, 2.5, 5
    × 10ⁿ) and a top that is a multiple of it. All-zero or missing data still gets an axis (0 to 1)."""
    if peak is None or not math.isfinite(peak) or peak <= 0:
        peak = 1
    raw = peak / ticks
    magnitude = 10 ** math.floor(math.log10(raw))
    step = 10 * magnitude
    for m in (1, 2, 2.5, 5, 10):
        if integer and m == 2.5 and magnitude < 10:
            continue  # 2.5 is not a whole number of items
        if m * magnitude >= raw:
            step = m * magnitude
            break
    if integer:
        step = max(1, math.ceil(step))
    top = step * math.ceil(round(peak / step, 9))
    return round(float(top), 12), round(float(step), 12)


def _g(value: float) -> str:
    return f"{value:g}"


def _n(x: float) -> str:
    """A coordinate: short, and never ``-0.0``."""
    return f"{x + 0.0:.1f}".rstrip("0").rstrip(".") or "0"


def _join(parts) -> SafeString:
    # conditional_escape leaves format_html's output alone and escapes anything else.
    return mark_safe("".join(str(conditional_escape(p)) for p in parts))


def _frame(chart_id: str, title: str, description: str, body, *, height: int = HEIGHT) -> SafeString:
    return format_html(
        '<svg class="chart" id="{id}" viewBox="0 0 {w} {h}" role="img" aria-labelledby="{id}-title {id}-desc" '
        'xmlns="http://www.w3.org/2000/svg"><title id="{id}-title">{title}</title><desc id="{id}-desc">{desc}</desc>'
        '<text class="chart-title" x="{x}" y="20">{title}</text>{body}</svg>',
        id=chart_id,
        w=WIDTH,
        h=height,
        title=title,
        desc=description,
        x=LEFT,
        body=_join(body),
    )


def _y_axis(top: float, step: float, fmt: Callable[[float], str], y_label: str, *, height: int = HEIGHT) -> list:
    """Gridlines and tick labels from 0 to ``top``, and the axis title turned along the axis."""
    plot_h = height - TOP - BOTTOM
    parts = []
    count = round(top / step)
    for i in range(count + 1):
        value = step * i
        y = TOP + plot_h - plot_h * value / top
        parts.append(
            format_html(
                '<line class="grid" x1="{}" x2="{}" y1="{y}" y2="{y}"/>'
                '<text class="tick-label" x="{}" y="{}" text-anchor="end">{}</text>',
                LEFT,
                WIDTH - RIGHT,
                LEFT - 6,
                _n(y + 4),
                fmt(value),
                y=_n(y),
            )
        )
    mid = TOP + plot_h / 2
    parts.append(
        format_html(
            '<text class="axis-label" x="14" y="{y}" text-anchor="middle" transform="rotate(-90 14 {y})">{}</text>',
            y_label,
            y=_n(mid),
        )
    )
    return parts


def _x_axis(x_label: str, *, height: int = HEIGHT) -> list:
    base = height - BOTTOM
    return [
        format_html('<line class="axis" x1="{}" x2="{}" y1="{y}" y2="{y}"/>', LEFT, WIDTH - RIGHT, y=base),
        format_html(
            '<text class="axis-label" x="{}" y="{}" text-anchor="middle">{}</text>',
            _n(LEFT + (WIDTH - LEFT - RIGHT) / 2),
            height - 8,
            x_label,
        ),
    ]


def _empty(chart_id: str, title: str, text: str) -> SafeString:
    body = [
        format_html(
            '<text class="chart-empty" x="{}" y="{}" text-anchor="middle">{}</text>', WIDTH // 2, HEIGHT // 2, text
        )
    ]
    return _frame(chart_id, title, text, body)


def bar_chart(
    points: Sequence[tuple[str, float | None]],
    *,
    chart_id: str,
    title: str,
    x_label: str,
    y_label: str,
    fmt: Callable[[float], str] = _g,
    tick_fmt: Callable[[float], str] | None = None,
    integer: bool = False,
    top: float | None = None,
    empty_text: str = "No data in this period",
) -> SafeString:
    """Vertical bars, one per point (``(label, value)``; a value of None draws no bar). ``top`` fixes the
    axis (100 for percentages); otherwise it is a round number above the largest value. ``fmt`` writes a
    value in the tooltips, ``tick_fmt`` (by default ``fmt``) on the axis."""
    if not points:
        return _empty(chart_id, title, empty_text)
    values = [v for _, v in points if v is not None]
    if top is None:
        top, step = nice_scale(max(values, default=0), integer=integer)
    else:
        step = nice_scale(top, integer=integer)[1]
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / len(points)
    bar_w = max(slot * 0.8, 1)
    every = math.ceil(len(points) / MAX_X_LABELS)
    body = _y_axis(top, step, tick_fmt or fmt, y_label)
    for i, (label, value) in enumerate(points):
        x = LEFT + slot * i + (slot - bar_w) / 2
        if value is not None:
            h = plot_h * min(value, top) / top
            body.append(
                format_html(
                    '<rect class="bar" x="{}" y="{}" width="{}" height="{}"><title>{}: {}</title></rect>',
                    _n(x),
                    _n(TOP + plot_h - h),
                    _n(bar_w),
                    _n(h),
                    label,
                    fmt(value),
                )
            )
        if i % every == 0:
            body.append(
                format_html(
                    '<text class="tick-label" x="{}" y="{}" text-anchor="middle">{}</text>',
                    _n(x + bar_w / 2),
                    HEIGHT - BOTTOM + 16,
                    label,
                )
            )
    body += _x_axis(x_label)
    shown = ", ".join(f"{label} {fmt(v)}" for label, v in points if v is not None)
    return _frame(chart_id, title, f"{y_label} by {x_label}: {shown or 'no values'}", body)


def histogram(
    bins: Sequence[Bin],
    *,
    chart_id: str,
    title: str,
    x_label: str,
    y_label: str = "runs",
    marks: Sequence[tuple[float, str]] = (),
    highlight_from: float | None = None,
    empty_text: str = "No data in this period",
) -> SafeString:
    """Adjacent bars, one per bin, with its count. ``marks``: vertical lines at values (a percentile),
    placed within their bin in proportion; bins starting at or above ``highlight_from`` are drawn as
    the tail (class ``tail``)."""
    if not bins:
        return _empty(chart_id, title, empty_text)
    top, step = nice_scale(max(b.count for b in bins), integer=True)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    w = plot_w / len(bins)
    every = math.ceil(len(bins) / MAX_X_LABELS)
    body = _y_axis(top, step, lambda v: str(int(v)), y_label)
    for i, b in enumerate(bins):
        x = LEFT + w * i
        h = plot_h * b.count / top
        tail = highlight_from is not None and b.lo >= highlight_from
        body.append(
            format_html(
                '<rect class="{}" x="{}" y="{}" width="{}" height="{}"><title>{}: {}</title></rect>',
                "bar tail" if tail else "bar",
                _n(x + 0.5),
                _n(TOP + plot_h - h),
                _n(max(w - 1, 0.5)),
                _n(h),
                b.label,
                b.count,
            )
        )
        if i % every == 0:
            body.append(
                format_html(
                    '<text class="tick-label" x="{}" y="{}" text-anchor="middle">{}</text>',
                    _n(x + w / 2),
                    HEIGHT - BOTTOM + 16,
                    b.label,
                )
            )
    body += _marks(bins, marks, w, plot_h)
    body += _x_axis(x_label)
    shown = ", ".join(f"{b.label}: {b.count}" for b in bins)
    return _frame(chart_id, title, f"{y_label} per bin of {x_label}: {shown}", body)


def _marks(bins: Sequence[Bin], marks: Sequence[tuple[float, str]], w: float, plot_h: float) -> list:
    """Vertical lines at values (a percentile) with their labels, placed within their bin in proportion."""
    body = []
    for n, (value, label) in enumerate(marks):
        x = _position(bins, value, LEFT, w)
        right = x > WIDTH - RIGHT - 160  # no room after the line: the label goes before it
        body.append(
            format_html(
                '<line class="mark" x1="{x}" x2="{x}" y1="{}" y2="{}"/>'
                '<text class="mark-label" x="{}" y="{}" text-anchor="{}">{}</text>',
                TOP - 4,
                TOP + plot_h,
                _n(x - 3 if right else x + 3),
                TOP + 8 + 12 * n,
                "end" if right else "start",
                label,
                x=_n(x),
            )
        )
    return body


def _position(bins: Sequence[Bin], value: float, left: float, w: float) -> float:
    """Where ``value`` falls along the x axis: within its bin in proportion (an open bin: its middle)."""
    for i, b in enumerate(bins):
        if b.hi is None or value < b.hi or i == len(bins) - 1:
            if b.hi is None or b.hi <= b.lo:
                return left + w * (i + 0.5)
            share = min(max((value - b.lo) / (b.hi - b.lo), 0), 1)
            return left + w * (i + share)
    return left  # pragma: no cover - bins is not empty


def _x_grid(top: float, step: float, fmt: Callable[[float], str], *, left: float, width: float, base: float) -> list:
    """Vertical grid lines with their values under the axis, from 0 to ``top``."""
    body = []
    for i in range(round(top / step) + 1):
        x = left + width * step * i / top
        body.append(
            format_html(
                '<line class="grid" x1="{x}" x2="{x}" y1="{}" y2="{}"/>'
                '<text class="tick-label" x="{x}" y="{}" text-anchor="middle">{}</text>',
                TOP,
                base,
                base + 16,
                fmt(step * i),
                x=_n(x),
            )
        )
    return body


def horizontal_bars(
    items: Sequence[tuple[str, float]],
    *,
    chart_id: str,
    title: str,
    x_label: str,
    fmt: Callable[[float], str] = _g,
    integer: bool = True,
    top: float | None = None,
    empty_text: str = "Nothing in this period",
    label_chars: int = 26,
) -> SafeString:
    """One horizontal bar per item, in the order given, its label on the left (shortened to
    ``label_chars``; the tooltip has it whole) and its value at the bar's end. ``top`` fixes the axis."""
    if not items:
        return _empty(chart_id, title, empty_text)
    row, label_w = 26, 200
    height = TOP + row * len(items) + BOTTOM
    if top is None:
        top, step = nice_scale(max(v for _, v in items), integer=integer)
    else:
        step = nice_scale(top, integer=integer)[1]
    plot_w = WIDTH - label_w - RIGHT - 40
    base = height - BOTTOM
    body = _x_grid(top, step, fmt, left=label_w, width=plot_w, base=base)
    for i, (label, value) in enumerate(items):
        y = TOP + row * i
        w = plot_w * min(value, top) / top
        short = label if len(label) <= label_chars else label[: label_chars - 1] + "…"
        body.append(
            format_html(
                '<text class="bar-label" x="{}" y="{}" text-anchor="end">{}</text>'
                '<rect class="bar" x="{}" y="{}" width="{}" height="{}"><title>{}: {}</title></rect>'
                '<text class="bar-value" x="{}" y="{}">{}</text>',
                label_w - 8,
                _n(y + row / 2 + 4),
                short,
                label_w,
                _n(y + 3),
                _n(w),
                row - 6,
                label,
                fmt(value),
                _n(label_w + w + 4),
                _n(y + row / 2 + 4),
                fmt(value),
            )
        )
    body += [
        format_html('<line class="axis" x1="{x}" x2="{x}" y1="{}" y2="{}"/>', TOP, base, x=label_w),
        format_html(
            '<text class="axis-label" x="{}" y="{}" text-anchor="middle">{}</text>',
            _n(label_w + plot_w / 2),
            height - 8,
            x_label,
        ),
    ]
    shown = ", ".join(f"{label}: {fmt(v)}" for label, v in items)
    return _frame(chart_id, title, f"{x_label}: {shown}", body, height=height)
