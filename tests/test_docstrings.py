"""Every public docstring parses as numpydoc without an unknown section: numpydoc drops such a section from
the API pages (issue 31: ``simulate``'s "Ensembles" section was missing from its built page)."""

import inspect
import warnings

import pytest

import sinkflow

numpydoc = pytest.importorskip("numpydoc.docscrape")


def _public():
    for name in sinkflow.__all__:
        obj = getattr(sinkflow, name)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            yield name, obj
            if inspect.isclass(obj):
                yield from ((f"{name}.{m}", f) for m, f in vars(obj).items()
                            if not m.startswith("_") and inspect.isfunction(f) and f.__doc__)


def test_no_public_docstring_has_a_section_numpydoc_drops():
    dropped = []
    for name, obj in _public():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            numpydoc.NumpyDocString(inspect.getdoc(obj) or "")
        dropped += [f"{name}: {w.message}" for w in caught if "Unknown section" in str(w.message)]
    assert not dropped, dropped


def test_the_check_sees_an_unknown_section():
    with pytest.warns(UserWarning, match="Unknown section Ensembles"):
        numpydoc.NumpyDocString("Summary.\n\nEnsembles\n---------\nText.\n")
