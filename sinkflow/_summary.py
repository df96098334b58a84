"""How a result summarizes itself: a short ``repr`` in a terminal and a small HTML table in Jupyter.

Every public result type (:class:`sinkflow.Trajectory`, :class:`sinkflow.SinkhornResult`,
:class:`sinkflow.NystromCheck`, ...) states its facts once, in :meth:`Summarized._facts`: a head
(what it is: kind, shapes, dtype) and at most :data:`MAX_LINES` ``- 1`` lines of ``(label, value)``
pairs. From these :class:`Summarized` builds both views:

- ``repr(result)``: the head after ``<Name>``, then one indented line per group of pairs, never
  an array's entries (the arrays stay attributes of the result);
- ``result._repr_html_()``: the same pairs in a ``<table>`` (text escaped with :func:`html.escape`),
  plus whatever :meth:`Summarized._html_extra` adds (a still of a particle flow).

A dataclass subclass is declared with ``repr=False`` (else the dataclass's own ``__repr__``
replaces the summary); a ``NamedTuple`` assigns ``__repr__ = Summarized.__repr__`` in its body.

Nothing heavy loads here: no torch, no matplotlib (a still is drawn by its result, lazily); the
helpers read shapes, dtypes and devices by attribute.
"""

from __future__ import annotations

import base64
import html

import numpy as np

__all__ = ["MAX_LINES", "Summarized", "describe_array", "number", "span", "shape_text", "png_data_uri", "as_numpy"]

#: Most lines a summary ``repr`` takes (the head included).
MAX_LINES = 6


def number(x, digits: int = 3) -> str:
    """A number as a short string: ints in full, floats to ``digits`` significant digits; ``None`` as ``"none"``."""
    if x is None:
        return "none"
    if isinstance(x, (bool, np.bool_)):
        return str(bool(x))
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    try:
        return f"{float(x):.{digits}g}"
    except (TypeError, ValueError):
        return str(x)


def span(values, digits: int = 3) -> str:
    """One value, or ``"lo to hi"`` over an array of per-system values (one value when all are equal)."""
    if values is None or np.ndim(values) == 0:
        return number(values, digits)
    arr = as_numpy(values).astype(float, copy=False).ravel()
    if arr.size == 0:
        return "none"
    lo, hi = np.nanmin(arr), np.nanmax(arr)
    return number(lo, digits) if lo == hi else f"{number(lo, digits)} to {number(hi, digits)}"


def shape_text(shape) -> str:
    """``(101, 64, 2)`` -> ``"101 x 64 x 2"``; ``()`` -> ``"scalar"``."""
    shape = tuple(int(s) for s in shape)
    return " x ".join(map(str, shape)) if shape else "scalar"


def describe_array(x) -> str:
    """Library and dtype of an array, with its device and autograd state for torch:
    ``"numpy float64"``, ``"torch float32 on cuda:0, requires grad"``."""
    library = type(x).__module__.split(".")[0]
    dtype = str(getattr(x, "dtype", type(x).__name__)).removeprefix("torch.")
    text = f"{library} {dtype}"
    if library == "torch":
        device = str(getattr(x, "device", "cpu"))
        if device != "cpu":
            text += f" on {device}"
        if getattr(x, "requires_grad", False):
            text += ", requires grad"
    return text


def as_numpy(x) -> np.ndarray:
    """Any array as numpy: a torch tensor is detached and copied to the CPU (half precisions as float32)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        if str(x.dtype) in ("torch.bfloat16", "torch.float16"):
            x = x.float()
        x = x.numpy()
    return np.asarray(x)


def png_data_uri(png: bytes) -> str:
    """PNG bytes as a ``data:`` URI for an ``<img src=...>``."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


class Summarized:
    """Mixin: a short ``__repr__`` and a ``_repr_html_`` table from :meth:`_facts`.

    Subclasses implement :meth:`_facts`; :meth:`_html_extra` may add HTML after the table, and
    ``_summary_hint`` names where the full report is (a closing line of the ``repr``).
    """

    __slots__ = ()

    #: A closing line of the repr, e.g. ``".summary(): the full report"`` (None: no such line).
    _summary_hint: str | None = None

    def _facts(self) -> tuple[str, list[list[tuple[str, str]]]]:
        """``(head, lines)``: what the result is, then groups of ``(label, value)`` pairs, one group a line."""
        raise NotImplementedError

    def _html_extra(self) -> str:
        """HTML shown after the table (already escaped); empty by default."""
        return ""

    def _lines(self) -> tuple[str, list[list[tuple[str, str]]]]:
        head, lines = self._facts()
        lines = [group for group in lines if group]
        room = MAX_LINES - 1 - (self._summary_hint is not None)
        if len(lines) > room:  # a summary never grows past MAX_LINES: the last groups share a line
            lines = lines[:room - 1] + [[pair for group in lines[room - 1:] for pair in group]]
        return head, lines

    def __repr__(self) -> str:
        head, lines = self._lines()
        text = [f"<{type(self).__name__}> {head}"]
        text += ["  " + "; ".join(f"{label}: {value}" if label else value for label, value in group) for group in lines]
        if self._summary_hint:
            text.append(f"  {self._summary_hint}")
        return "\n".join(text)

    def _repr_html_(self) -> str:
        head, lines = self._lines()
        esc = html.escape
        cell = "text-align:left;padding:1px 8px 1px 0;vertical-align:top"
        rows = "".join(f'<tr><th style="{cell}">{esc(label)}</th><td style="{cell}">{esc(value)}</td></tr>'
                       for group in lines for label, value in group)
        hint = f'<div style="font-size:smaller">{esc(self._summary_hint)}</div>' if self._summary_hint else ""
        return (f'<div class="sinkflow-summary"><table style="border-collapse:collapse">'
                f'<caption style="text-align:left;caption-side:top"><b>{esc(type(self).__name__)}</b> {esc(head)}'
                f"</caption>{rows}</table>{hint}{self._html_extra()}</div>")
