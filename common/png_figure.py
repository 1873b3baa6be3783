"""A matplotlib figure written to a PNG file atomically, on machines without a display.

Example::

    with png_figure("run.png", 1, 2, figsize=(12, 4), dpi=100) as (fig, axes):
        axes[0].plot([0, 1], [0.7, 0.6])
    # run.png appears complete (temporary name, then rename) or not at all
"""

import contextlib
import datetime
from collections.abc import Iterator
from typing import Any

from common.atomic import atomic_path


@contextlib.contextmanager
def png_figure(
    path: str, nrows: int = 1, ncols: int = 1, bottom: float = 0.0, **subplots: Any
) -> Iterator[tuple[Any, Any]]:
    """Yields ``plt.subplots(nrows, ncols, **subplots)``; when the block ends normally the
    figure is dated (`date_footer`), laid out and saved to ``path`` at its own dpi. The
    figure is closed either way.

    Args:
        path: the PNG to write.
        nrows, ncols: the grid of axes.
        bottom: the fraction of the figure's height kept free under the axes (above the
            date), for a figure-wide legend.
        subplots: more arguments of ``plt.subplots`` (figsize, dpi, ...).
    """
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, **subplots)
    try:
        yield fig, axes
        date_footer(fig)
        fig.tight_layout(rect=(0, FOOTER_HEIGHT + bottom, 1, 1))
        with atomic_path(path, suffix=".tmp.png") as tmp:
            fig.savefig(tmp, format="png", dpi=fig.dpi)
    finally:
        plt.close(fig)


# The bottom fraction of a figure kept free for its date.
FOOTER_HEIGHT = 0.03


def drawn_date() -> str:
    """Today's date (UTC) as figures and the docs beside them show it."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")


def date_footer(fig: Any) -> None:
    """Writes "drawn YYYY-MM-DD" in the bottom right corner, so a figure copied into the
    docs says how old it is."""
    fig.text(0.995, 0.005, f"drawn {drawn_date()} (UTC)", ha="right", va="bottom", fontsize="x-small", color="dimgray")
