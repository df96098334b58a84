"""Reference data of committed figures, the tolerances new data are compared within, and the manifest.

Another CPU kernel (``ATEN_CPU_CAPABILITY=default|avx2|avx512``), another BLAS kernel or
another thread count changes a seeded computation at rounding level: positions by 1e-15,
but quantities that are themselves rounding noise (an identity checked to 1e-12, a Sinkhorn
error curve at 1e-15) in their leading digits. So a figure's data are not hashed: they are
stored exactly (``data/NAME.npz`` beside the figure) and a rerun is compared with them array
by array, within a :class:`Tolerance` that is absolute and relative, and that counts two
values both below a floor as equal (both "at rounding level").

The default tolerance was set from the spread measured across the CPU and BLAS kernels on
the committed figures, with a margin of 700 or more (see ``docs/reproducibility.md``); a
figure states a wider one for an array that needs it (a rate fitted on a noisy tail).
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["Tolerance", "DEFAULT_TOLERANCE", "flatten_data", "compare_data", "data_checksum", "reference_path",
           "write_reference", "read_reference", "read_manifest", "write_manifest", "MANIFEST_COLUMNS"]


@dataclass(frozen=True)
class Tolerance:
    """How far a recomputed array may be from its reference.

    An element passes when ``|new - ref| <= atol + rtol * |ref|``, or when both ``|new|`` and
    ``|ref|`` are at most ``floor`` (quantities at rounding level, such as an identity error
    near 1e-12, compare as "below the floor"). NaN must meet NaN and an infinity the same
    infinity. Integer, boolean and text arrays must be equal.

    Examples
    --------
    >>> import numpy as np
    >>> from sinkflow.plots import Tolerance
    >>> tol = Tolerance(rtol=1e-6, atol=0.0, floor=1e-10)
    >>> tol.allows(np.array([1.0 + 1e-7, 3e-12]), np.array([1.0, 8e-13])).tolist()
    [True, True]
    >>> tol.allows(np.array([1.0 + 1e-5]), np.array([1.0])).tolist()
    [False]
    """

    rtol: float = 1e-8
    atol: float = 1e-13
    floor: float = 1e-10

    def allows(self, new: np.ndarray, ref: np.ndarray) -> np.ndarray:
        """Element-wise: is ``new`` within this tolerance of ``ref``?"""
        new, ref = np.asarray(new, dtype=float), np.asarray(ref, dtype=float)
        with np.errstate(invalid="ignore"):
            close = np.isfinite(ref) & (np.abs(new - ref) <= self.atol + self.rtol * np.abs(ref))
        both_small = (np.abs(new) <= self.floor) & (np.abs(ref) <= self.floor)
        same_special = (np.isnan(new) & np.isnan(ref)) | (np.isinf(ref) & (new == ref))
        return close | both_small | same_special


#: What every array of every figure is compared within unless the figure says otherwise.
DEFAULT_TOLERANCE = Tolerance()


def flatten_data(data: dict) -> dict[str, np.ndarray]:
    """A figure's data as flat ``name -> array`` (nested dicts as ``a.b``, ragged lists as ``a[i]``).

    This is what ``sinkflow figures --data`` writes (NPZ) and what the reference data hold.

    Examples
    --------
    >>> from sinkflow.plots import flatten_data
    >>> sorted(flatten_data({"x": [1.0, 2.0], "run": {"err": [[1, 2], [3]]}}))
    ['run.err[0]', 'run.err[1]', 'x']
    """
    flat: dict[str, np.ndarray] = {}

    def feed(key, value):
        if isinstance(value, dict):
            for k in sorted(value):
                feed(f"{key}.{k}" if key else str(k), value[k])
        elif isinstance(value, (list, tuple)) and not all(isinstance(v, (int, float, np.number)) for v in value):
            try:
                flat[key] = np.asarray(value, dtype=float)
            except (ValueError, TypeError):
                for i, v in enumerate(value):
                    feed(f"{key}[{i}]", v)
        else:
            flat[key] = np.asarray(value)

    feed("", data)
    return flat


def _tolerance_for(key: str, tolerances: dict) -> Tolerance:
    for pattern, tol in tolerances.items():
        if fnmatch.fnmatchcase(key, pattern):
            return tol
    return DEFAULT_TOLERANCE


def _compare_array(key: str, new: np.ndarray, ref: np.ndarray, tol: Tolerance) -> str | None:
    if new.shape != ref.shape:
        return f"{key}: shape {new.shape} != {ref.shape} (reference)"
    floats = new.dtype.kind in "fc" or ref.dtype.kind in "fc"
    if not floats or new.dtype.kind not in "biufc" or ref.dtype.kind not in "biufc":
        return None if np.array_equal(new, ref) else f"{key}: values differ from the reference (compared exactly)"
    bad = ~tol.allows(new.real, ref.real) | ~tol.allows(np.imag(new), np.imag(ref))
    if not bad.any():
        return None
    i = np.unravel_index(np.argmax(np.where(bad, np.abs(new - ref), -1.0)), new.shape) if new.ndim else ()
    return (f"{key}: {int(bad.sum())} of {bad.size} values outside rtol={tol.rtol:g}, atol={tol.atol:g}, "
            f"floor={tol.floor:g}; worst at {tuple(map(int, i))}: {new[i]!r} vs {ref[i]!r} (reference)")


def compare_data(data: dict, reference: dict, tolerances: dict | None = None) -> list[str]:
    """What differs between a figure's new data and its reference, beyond the tolerances.

    Parameters
    ----------
    data, reference : dict
        Figure data (nested, as ``compute`` returns) or already flat (:func:`flatten_data`).
    tolerances : dict, optional
        ``pattern -> Tolerance`` for the flat keys (shell-style patterns, first match wins);
        other keys use :data:`DEFAULT_TOLERANCE`.

    Returns
    -------
    list of str
        One line per differing array (missing, extra, other shape, values outside the
        tolerance with the worst element); empty when the data agree.

    Examples
    --------
    >>> import numpy as np
    >>> from sinkflow.plots import compare_data
    >>> ref = {"x": np.linspace(0, 1, 5), "err": np.array([3e-13, 1e-12])}
    >>> compare_data({"x": ref["x"] * (1 + 1e-13), "err": np.array([9e-13, 2e-14])}, ref)
    []
    >>> compare_data({"x": ref["x"] + 1e-3, "err": ref["err"]}, ref)[0].split(":")[0]
    'x'
    """
    new, ref = flatten_data(data), flatten_data(reference)
    tolerances = tolerances or {}
    problems = [f"{k}: missing (in the reference, not in the new data)" for k in sorted(set(ref) - set(new))]
    problems += [f"{k}: not in the reference" for k in sorted(set(new) - set(ref))]
    for key in sorted(set(new) & set(ref)):
        line = _compare_array(key, np.asarray(new[key]), np.asarray(ref[key]), _tolerance_for(key, tolerances))
        if line:
            problems.append(line)
    return problems


def reference_path(folder: str | Path, name: str) -> Path:
    """Where the reference data of figure ``name`` written into ``folder`` live: ``folder/data/NAME.npz``."""
    return Path(folder) / "data" / f"{name}.npz"


def write_reference(path: str | Path, data: dict) -> None:
    """Write a figure's flat data as NPZ, byte-identical for the same data (no timestamps).

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> import numpy as np
    >>> from sinkflow.plots import read_reference, write_reference
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     write_reference(Path(tmp, "a.npz"), {"x": np.arange(3.0)})
    ...     write_reference(Path(tmp, "b.npz"), {"x": np.arange(3.0)})
    ...     same = Path(tmp, "a.npz").read_bytes() == Path(tmp, "b.npz").read_bytes()
    ...     print(same, read_reference(Path(tmp, "a.npz"))["x"].tolist())
    True [0.0, 1.0, 2.0]
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for key, arr in sorted(flatten_data(data).items()):
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.asarray(arr), allow_pickle=False)
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, buf.getvalue())


def read_reference(path: str | Path) -> dict[str, np.ndarray]:
    """The flat data stored by :func:`write_reference` (an empty dict when there is no file)."""
    path = Path(path)
    if not path.is_file():
        return {}
    with np.load(path, allow_pickle=False) as npz:
        return {key: npz[key] for key in npz.files}


def data_checksum(data: dict) -> str:
    """Short SHA-256 over a figure's data, exactly (names, shapes, dtypes and bytes).

    ``MANIFEST.tsv`` records it for the reference data a figure was drawn from; whether new
    data reproduce a figure is decided within tolerances (:func:`compare_data`), never by
    this hash.

    Examples
    --------
    >>> from sinkflow.plots import data_checksum
    >>> data_checksum({"x": [0.5, 0.25]}) == data_checksum({"x": [0.5, 0.25]})
    True
    >>> data_checksum({"x": [0.1 + 0.2]}) == data_checksum({"x": [0.3]})   # exact: last bits count
    False
    """
    h = hashlib.sha256()
    for key, arr in sorted(flatten_data(data).items()):
        arr = np.asarray(arr)
        h.update(f"{key}|{arr.shape}|{arr.dtype.str}|".encode())
        h.update(repr(arr.tolist()).encode() if arr.dtype == object else np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()[:16]


def _file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


#: Columns of ``MANIFEST.tsv``, one row per written file.
MANIFEST_COLUMNS = ("figure", "mode", "file", "config_hash", "data_checksum", "file_sha256")


def read_manifest(folder: str | Path) -> dict[str, dict[str, str]]:
    """The rows of ``folder/MANIFEST.tsv``, keyed by file name.

    Parameters
    ----------
    folder : str or Path
        Folder holding ``MANIFEST.tsv``.

    Returns
    -------
    dict
        ``file name -> {column: value}`` over :data:`MANIFEST_COLUMNS`; empty when there is
        no manifest. Lines without one value per column are skipped.

    Examples
    --------
    >>> import tempfile
    >>> from sinkflow.plots import MANIFEST_COLUMNS, read_manifest, write_manifest
    >>> row = dict(zip(MANIFEST_COLUMNS, ("demo", "quick", "demo.png", "0" * 16, "1" * 16, "2" * 16)))
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     empty = read_manifest(tmp)   # no MANIFEST.tsv yet
    ...     write_manifest(tmp, {"demo.png": row})
    ...     print(empty, read_manifest(tmp) == {"demo.png": row})
    {} True
    """
    path = Path(folder) / "MANIFEST.tsv"
    lines = path.read_text().splitlines() if path.is_file() else []
    rows = (line.split("\t") for line in lines[1:])
    return {cells[2]: dict(zip(MANIFEST_COLUMNS, cells, strict=True))
            for cells in rows if len(cells) == len(MANIFEST_COLUMNS)}


def write_manifest(folder: str | Path, rows: dict[str, dict[str, str]]) -> None:
    """Write ``folder/MANIFEST.tsv``: a header, then the rows sorted by file name.

    Parameters
    ----------
    folder : str or Path
        Folder to write ``MANIFEST.tsv`` in.
    rows : dict
        ``file name -> {column: value}``, as :func:`read_manifest` returns.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> from sinkflow.plots import MANIFEST_COLUMNS, read_manifest, write_manifest
    >>> rows = {f: dict(zip(MANIFEST_COLUMNS, ("demo", "quick", f, "a" * 16, "b" * 16, "c" * 16)))
    ...         for f in ("demo.pdf", "demo.png")}
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     write_manifest(tmp, rows)
    ...     lines = Path(tmp, "MANIFEST.tsv").read_text().splitlines()
    ...     print(read_manifest(tmp) == rows, lines[0].split("\\t") == list(MANIFEST_COLUMNS), len(lines))
    True True 3
    """
    lines = ["\t".join(MANIFEST_COLUMNS)] + ["\t".join(rows[f][c] for c in MANIFEST_COLUMNS) for f in sorted(rows)]
    (Path(folder) / "MANIFEST.tsv").write_text("\n".join(lines) + "\n")


def _update_manifest(out: Path, name: str, mode: str, written, chash: str, dsum: str) -> None:
    # rows of this figure drawn from other data no longer describe the reference data
    rows = {f: r for f, r in read_manifest(out).items() if r["figure"] != name or r["data_checksum"] == dsum}
    for p in written:
        rows[p.name] = dict(zip(MANIFEST_COLUMNS, (name, mode, p.name, chash, dsum, _file_hash(p)), strict=True))
    write_manifest(out, rows)
