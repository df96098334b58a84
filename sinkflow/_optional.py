"""Optional dependencies: import one where a feature needs it, or say which extra installs it.

``pip install sinkflow`` (no extras) runs every public function and every registered
figure but three (``training_column_sums`` trains on scikit-learn's digits;
``cluster_predictions`` and ``dynamic_metastability`` draw study runs committed in
``docs/data/clustering/`` of a source checkout, which a wheel does not ship). A feature
that needs a package of an extra of ``pyproject.toml`` imports it on use through
:func:`require`, which raises :class:`MissingExtraError` naming the extra::

    ImportError: sinkflow.phase_diagram needs pandas: pip install "sinkflow[sweep]"

and one that reads a file of the checkout finds it through :func:`checkout_file`, which
raises :class:`NeedsCheckoutError` saying so. :data:`EXTRAS` is the one table of which
extra installs which module (a test holds it to ``pyproject.toml``). Nothing here imports
anything at import time: the command line's ``--list`` and ``import sinkflow`` stay fast.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

__all__ = ["EXTRAS", "MissingExtraError", "NeedsCheckoutError", "require", "checkout_file", "available",
           "install_hint"]

#: Optional module (top-level import name) -> (the distribution to name, the extra of pyproject.toml that installs it).
EXTRAS: dict[str, tuple[str, str]] = {
    "pandas": ("pandas", "sweep"),
    "dask": ("dask", "sweep"),
    "distributed": ("dask.distributed", "sweep"),
    "bokeh": ("bokeh", "sweep"),
    "sklearn": ("scikit-learn", "models"),
    "ipywidgets": ("ipywidgets", "notebooks"),
    "xarray": ("xarray", "analysis"),
}


class MissingExtraError(ModuleNotFoundError):
    """An optional module is not installed; the message names the extra that installs it.

    A :class:`ModuleNotFoundError` (so an :class:`ImportError`): ``except ImportError``
    still catches it. ``name`` is the missing module, ``extra`` the extra to install,
    ``feature`` what needed it.
    """

    def __init__(self, message: str, *, name: str, extra: str, feature: str):
        super().__init__(message, name=name)
        self.extra = extra
        self.feature = feature


class NeedsCheckoutError(FileNotFoundError):
    """A feature reads a file of the source checkout (``docs/data/...``) that an installed wheel lacks."""


def _is_path(need: str) -> bool:
    return "/" in need


def install_hint(need: str) -> str:
    """What installs ``need``: an optional module (``'pandas: pip install "sinkflow[sweep]"'``) or a file of
    the source checkout (``'docs/data/x.json of a source checkout: pip install -e . in a clone'``).

    >>> install_hint("sklearn")
    'scikit-learn: pip install "sinkflow[models]"'
    """
    if _is_path(need):
        return f"{need} of a source checkout (not in the wheel): pip install -e . in a clone"
    package, extra = EXTRAS[need.split(".")[0]]
    return f'{package}: pip install "sinkflow[{extra}]"'


def checkout_path(relative: str) -> Path:
    """``relative`` (``"docs/data/..."``) in the checkout sinkflow is imported from (exists in an editable install)."""
    return Path(__file__).resolve().parents[1] / relative


def checkout_file(relative: str, feature: str) -> Path:
    """The file ``relative`` of the source checkout, or :class:`NeedsCheckoutError` saying that ``feature`` needs it."""
    path = checkout_path(relative)
    if not path.is_file():
        raise NeedsCheckoutError(f"{feature} needs {install_hint(relative)}")
    return path


def available(need: str) -> bool:
    """Whether the module ``need`` can be imported here, without importing it (a hidden module counts as
    absent), or whether the checkout has the file ``need`` (a path, with a ``/``).

    >>> available("numpy"), available("no_such_module"), available("pyproject.toml/no_such_file")
    (True, False, False)
    """
    if _is_path(need):
        return checkout_path(need).is_file()
    try:
        return importlib.util.find_spec(need) is not None
    except (ImportError, ValueError):  # a dotted name whose parent is absent; a module without a spec
        return False


def require(module: str, feature: str, extra: str | None = None):
    """Import ``module`` for ``feature``, or raise :class:`MissingExtraError` naming the extra to install.

    Parameters
    ----------
    module : str
        What to import (``"pandas"``, ``"sklearn.datasets"``); its top-level name must be in
        :data:`EXTRAS`.
    feature : str
        What needs it, as the message should name it (``"sinkflow.phase_diagram"``).
    extra : str, optional
        The extra to name where the module is in several (pandas is in ``sweep`` and ``analysis``);
        :data:`EXTRAS`' by default.

    Returns
    -------
    module
        The imported module.

    Raises
    ------
    MissingExtraError
        ``module`` (or a package above it) is not installed. Any other import failure of an
        installed module (a broken install) is raised as it is.

    Examples
    --------
    >>> from sinkflow._optional import require
    >>> require("sklearn", "sinkflow.studies.data.digits").__name__   # installed here (the test extra)
    'sklearn'
    """
    top = module.split(".")[0]
    if top not in EXTRAS:
        raise ValueError(f"{module!r} is not an optional module of sinkflow (add it to EXTRAS)")
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        parts = module.split(".")
        absent = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
        if err.name not in absent:  # installed, but something it imports is not: a broken install
            raise
        package, default = EXTRAS[top]
        extra = default if extra is None else extra
        raise MissingExtraError(f'{feature} needs {package}: pip install "sinkflow[{extra}]"', name=err.name,
                                extra=extra, feature=feature) from None
