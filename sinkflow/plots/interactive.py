"""Sliders for the teaching notebooks, with a static fallback where ipywidgets is missing.

A slider recomputes when it is released, never while it is dragged (``continuous_update=False``),
and a callback's return value is never shown (a figure is the answer, not a repr under it).
"""

from __future__ import annotations

import functools
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
    None
        The sliders are displayed (they update on release); without ipywidgets ``function()``
        is called once with its defaults. ``function``'s return value is dropped either way.

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
    quiet = _quiet(function)
    try:
        import ipywidgets
    except ImportError:
        quiet()
        return None
    widgets = {name: _on_release(ipywidgets.interactive.widget_from_abbrev(abbrev, defaults[name].default))
               for name, abbrev in controls.items()}
    ipywidgets.interact(quiet, **widgets)
    return None


def _quiet(function):
    """``function`` with its result dropped (Jupyter would print it under the figure on every move)."""
    @functools.wraps(function)
    def call(*args, **kwargs) -> None:
        function(*args, **kwargs)

    return call


def _on_release(widget):
    """Update on release of the slider (or on Enter in a text box), not on every step of a drag."""
    if "continuous_update" in widget.keys:
        widget.continuous_update = False
    return widget
