"""Sliders for the teaching notebooks, with a static fallback where ipywidgets is missing."""

from __future__ import annotations

import inspect

__all__ = ["interact"]


def interact(function, **controls):
    """Call ``function`` under sliders in Jupyter, or once with its defaults without ipywidgets.

    Parameters
    ----------
    function : callable
        Draws one state (a figure, a printed line); every argument named in ``controls``
        needs a default, the state shown first.
    **controls
        ``ipywidgets.interact`` abbreviations: ``(min, max, step)`` for a slider (integers
        give an integer slider), a list for a drop-down.

    Returns
    -------
    The ``ipywidgets.interact`` widget, or ``function()``'s result when ipywidgets is missing.

    Examples
    --------
    >>> def show(eps=0.1):
    ...     print(f"eps = {eps}")
    >>> interact(show, n=(1, 10, 1))
    Traceback (most recent call last):
    ...
    ValueError: controls need arguments of show with defaults: ['n']
    """
    defaults = inspect.signature(function).parameters
    missing = [name for name in controls if name not in defaults or defaults[name].default is inspect.Parameter.empty]
    if missing:
        raise ValueError(f"controls need arguments of {function.__name__} with defaults: {missing}")
    try:
        import ipywidgets
    except ImportError:
        return function()
    return ipywidgets.interact(function, **controls)
