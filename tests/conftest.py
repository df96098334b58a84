"""Test-session settings: one thread everywhere.

Results do not depend on it, but on a shared 2-core machine OpenMP/OpenBLAS spin-waiting
made small linear algebra 10-150x slower with two threads (docs/performance.md), and one
thread keeps timings of the whole suite predictable.
"""

import os

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")  # inherited by notebook kernels and subprocesses

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import settings  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

# Property tests draw the same examples on every run (a failure reproduces, and a clean clone cannot
# turn red by chance); HYPOTHESIS_PROFILE=explore draws fresh ones, many more, to look for new failures.
settings.register_profile("default", derandomize=True)
settings.register_profile("explore", derandomize=False, max_examples=300)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

torch.set_num_threads(1)
_BLAS_LIMIT = threadpool_limits(1)


# End-to-end runs that take most of the suite's time: the Sphinx build and the notebooks
# (each starts a kernel). The default run excludes them (five-minute budget); CI runs them
# in a second command, ``python -m pytest -q -m "integration and not slow"``.
_INTEGRATION_FILES = {"test_docs.py", "test_notebooks.py"}


@pytest.hookimpl(tryfirst=True)  # before the -m deselection
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in _INTEGRATION_FILES:
            item.add_marker(pytest.mark.integration)
