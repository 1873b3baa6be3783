"""A matplotlib figure written to a PNG file atomically, on machines without a display.

Example::

    with png_figure("run.png", 1, 2, figsize=(12, 4), dpi=100) as (fig, axes):
        axes[0].plot([0, 1], [0.7, 0.6])
    # run.png appears complete (temporary name, then rename) or not at all
"""

import contextlib
from typing import Any, Iterator, Tuple

from common.atomic import atomic_path


@contextlib.contextmanager
def png_figure(path: str, nrows: int = 1, ncols: int = 1, **subplots: Any) -> Iterator[Tuple[Any, Any]]:
    """Yields ``plt.subplots(nrows, ncols, **subplots)``; when the block ends normally the
    figure is laid out and saved to ``path`` at its own dpi. The figure is closed either way.

    Args:
        path: the PNG to write.
        nrows, ncols: the grid of axes.
        subplots: more arguments of ``plt.subplots`` (figsize, dpi, ...).
    """
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, **subplots)
    try:
        yield fig, axes
        fig.tight_layout()
        with atomic_path(path, suffix=".tmp.png") as tmp:
            fig.savefig(tmp, format="png", dpi=fig.dpi)
    finally:
        plt.close(fig)
