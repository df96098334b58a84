"""Progress bars shown only where someone watches them: a terminal or a Jupyter notebook."""

from __future__ import annotations

from tqdm.auto import tqdm

__all__ = ["progress_bar", "LONG_RUN_SECONDS"]

#: A run left at the default (``enabled=None``) shows its bar once it has taken this long.
LONG_RUN_SECONDS = 2.0


def progress_bar(iterable=None, *, enabled: bool | None = True, **kwargs):
    """A ``tqdm.auto`` bar, quiet when its stream is not a terminal (a log file, a pipe, CI).

    ``disable=None`` is tqdm's own rule for that: off for a stream that is not a TTY. The
    notebook bar (a widget) ignores the stream and stays on in Jupyter. ``enabled=None`` (the
    default of long computations such as :func:`sinkflow.simulate`) draws the bar only once the
    loop has run for :data:`LONG_RUN_SECONDS` (a short run shows nothing); False never draws it.

    Examples
    --------
    >>> import io
    >>> progress_bar(range(3), file=io.StringIO()).disable   # not a terminal: no bar
    True
    >>> sum(progress_bar(range(3), enabled=False))            # iterates as the iterable does
    3
    """
    if enabled is None:
        kwargs.setdefault("delay", LONG_RUN_SECONDS)
    return tqdm(iterable, disable=None if enabled is not False else True, **kwargs)
