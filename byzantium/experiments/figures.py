"""The pieces every figure of `byzantium plot` is drawn with (plot.py, report_frontier.py, report_scale.py):
matplotlib without a display, 0-100 % axes and clipped error bars, panel grids, values on bars."""

DPI = 110


def plt():
    import matplotlib
    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as pyplot
    return pyplot


def clip(v):
    return min(100.0, max(0.0, v))


def err(ts):
    """(points, [lower errors, upper errors]) in % from (point, lo, hi) tuples, the interval clipped to
    0-100 %; None stays NaN (a gap in the line), an interval of None bounds ("n too small") no bar."""
    nan = float("nan")
    ys = [100 * t[0] if t else nan for t in ts]
    lo = [100 * t[0] - clip(100 * t[1]) if t and t[1] is not None else nan for t in ts]
    hi = [clip(100 * t[2]) - 100 * t[0] if t and t[2] is not None else nan for t in ts]
    return ys, [lo, hi]


def percent_axis(ax, label="accuracy (%)"):
    ax.set_ylim(0, 100)  # the lines are drawn unclipped (clip_on=False), so markers on 0 or 100 show whole
    ax.set_ylabel(label)
    ax.grid(True, alpha=0.3)


def values(ax, bars, fmt):
    """Each bar's value written on it, so that a bar says what it shows without reading the axis."""
    ax.bar_label(bars, labels=[fmt(b.get_height()) for b in bars], fontsize=7, padding=2)


def grid(n, ncols=3):
    """n panels, up to ncols a row (a paper-scale sweep has dozens of settings); spare axes hidden."""
    rows, cols = -(-n // ncols), min(n, ncols)
    fig, axes = plt().subplots(rows, cols, figsize=(6 * cols, 4.2 * rows), squeeze=False)
    axes = list(axes.flat)
    for ax in axes[n:]:
        ax.set_visible(False)
    return axes[:n], fig


def save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt().close(fig)
    return path


def count(v):
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if v >= size:
            return f"{v / size:.1f}{unit}"
    return f"{v:.0f}"
