"""One figure for a command's ``--plot FILE``: matplotlib (the ``plot`` extra) on the Agg backend,
written to FILE; a missing matplotlib or an unwritable path is a one-line ``ConfigError``."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from ..errors import ConfigError


def written_path(path) -> Path:
    """The file a figure saved to `path` ends up in: matplotlib appends ``.png`` to a name without
    an extension (``--plot /x/sweep`` writes ``/x/sweep.png``)."""
    path = Path(path)
    return path if path.suffix else path.with_name(path.name + ".png")


@contextmanager
def figure(path: Path, size_in: tuple[float, float] = (6.4, 4.0)):
    """Yield ``(fig, ax)``; on leaving, lay the figure out, save it to :func:`written_path` of
    `path` and close it."""
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'mofa[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=size_in)
    try:
        yield fig, ax
        fig.tight_layout()
        try:
            fig.savefig(written_path(path))
        except OSError as exc:
            raise ConfigError(f"--plot {path}: cannot write: {exc}") from None
    finally:
        plt.close(fig)
