"""Progress bars shown only where someone watches them: a terminal or a Jupyter notebook."""

from __future__ import annotations

from tqdm.auto import tqdm

__all__ = ["progress_bar"]


def progress_bar(iterable=None, *, enabled: bool = True, **kwargs):
    """A ``tqdm.auto`` bar, quiet when its stream is not a terminal (a log file, a pipe, CI).

    ``disable=None`` is tqdm's own rule for that: off for a stream that is not a TTY. The
    notebook bar (a widget) ignores the stream and stays on in Jupyter.

    Examples
    --------
    >>> import io
    >>> progress_bar(range(3), file=io.StringIO()).disable   # not a terminal: no bar
    True
    >>> sum(progress_bar(range(3), enabled=False))            # iterates as the iterable does
    3
    """
    return tqdm(iterable, disable=None if enabled else True, **kwargs)
