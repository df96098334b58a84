#!/usr/bin/env bash
# The package as a user gets it: a wheel built from this checkout, installed without extras
# into a fresh virtual environment, run from an empty folder (never the checkout's sources).
#   - the wheel holds every file of sinkflow/ that git tracks (py.typed, any data file);
#   - every module imports and every name of sinkflow.__all__ resolves, without extras;
#   - the README's first example and `sinkflow figures --all --quick` run; the figures that
#     are not made are exactly those `sinkflow figures --list` marks as needing what is
#     missing (an extra, or the checkout's docs/data), each named in one line;
#   - `sinkflow figures --check` from the repository root reproduces the committed figures.
# Usage: bash .ci/install_check.sh   (from anywhere; needs python >= 3.10 with venv, and git)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
export MPLBACKEND=Agg
start=$SECONDS
python=${PYTHON:-python}

echo "== wheel"
# built from a copy of the files git sees (tracked, or new and not ignored), as in a fresh clone: no stale
# build/ folder of the checkout can slip a file into the wheel, and the checkout is left as it was
"$python" - "$repo" "$work/src" <<'EOF'
import shutil, subprocess, sys
from pathlib import Path
repo, dest = map(Path, sys.argv[1:])
listed = subprocess.run(["git", "-C", repo, "ls-files", "-z", "-co", "--exclude-standard"], capture_output=True,
                        check=True).stdout.decode().split("\0")
for name in filter(None, listed):
    if (repo / name).is_file():  # not a tracked file deleted in the working tree
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / name, dest / name)
EOF
"$python" -m pip wheel -q --no-deps --disable-pip-version-check -w "$work/dist" "$work/src"
wheel=$(ls "$work"/dist/sinkflow-*.whl)
"$python" - "$wheel" "$repo" <<'EOF'
import subprocess, sys, zipfile
from pathlib import Path
wheel, repo = sys.argv[1:]
names = set(zipfile.ZipFile(wheel).namelist())
tracked = subprocess.run(["git", "-C", repo, "ls-files", "-co", "--exclude-standard", "sinkflow"],
                         capture_output=True, text=True, check=True).stdout.split()
tracked = [f for f in tracked if (Path(repo) / f).is_file()]
missing = [f for f in tracked if f not in names]
assert not missing, f"files of sinkflow/ missing from the wheel: {missing}"
print(f"{len(tracked)} files of sinkflow/ in {wheel.rsplit('/', 1)[-1]}, py.typed included:",
      "sinkflow/py.typed" in names)
EOF

echo "(wheel: $((SECONDS - start)) s)"

echo "== bare install (no extras)"
"$python" -m venv "$work/venv"
bin="$work/venv/bin"
t0=$SECONDS
"$bin/python" -m pip install -q --disable-pip-version-check torch==2.13.0 "$wheel"
echo "(venv and install: $((SECONDS - t0)) s)"
mkdir "$work/empty"
cd "$work/empty"
"$bin/python" - <<'EOF'
import importlib, importlib.util, pkgutil, site, sys
import sinkflow
from sinkflow._optional import EXTRAS
assert sinkflow.__file__.startswith(tuple(site.getsitepackages())), f"not the wheel: {sinkflow.__file__}"
present = [m for m in EXTRAS if importlib.util.find_spec(m) is not None]
assert not present, f"not a bare install: {present} installed"
modules = [m.name for m in pkgutil.walk_packages(sinkflow.__path__, "sinkflow.") if not m.name.endswith("__main__")]
for name in modules:
    importlib.import_module(name)
for name in sinkflow.__all__:
    getattr(sinkflow, name)
print(f"{sinkflow.__file__}: {len(modules)} modules import, {len(sinkflow.__all__)} public names resolve")
EOF
"$bin/python" -c "import sinkflow, numpy as np; t = sinkflow.simulate(np.random.default_rng(0).normal(size=(8, 2)), steps=3); print(t)"

echo "== sinkflow figures --all --quick (bare, in an empty folder) and --check (from the repository root)"
# Two processes on two cores (quick figures run on one thread): every registered figure made and written
# from the wheel, and the default set recomputed and compared with the committed figures.
t0=$SECONDS
(cd "$repo" && exec "$bin/sinkflow" figures --check) > check.log 2>&1 &
check=$!
rc=0
"$bin/sinkflow" figures --all --quick --out figs 2> all.log || rc=$?
tr '\r' '\n' < all.log | grep -v '^figures (quick)' || true
[ "$rc" = 0 ] || [ "$rc" = 3 ] || { echo "sinkflow figures --all exited with $rc"; exit 1; }
if grep -q Traceback all.log; then echo "a traceback in the output of sinkflow figures"; exit 1; fi
"$bin/sinkflow" figures --list | sed -n 's/^. \([a-z0-9_]*\) .*: not installed\]$/\1/p' | sort > declared
tr '\r' '\n' < all.log | sed -n 's/^\([a-z0-9_]*\): not made: needs .*/\1/p' | sort > not_made
diff declared not_made || { echo "figures not made (right) differ from those --list marks as missing what they need"; exit 1; }
echo "not made, as --list declares: $(tr '\n' ' ' < not_made)(--all: $((SECONDS - t0)) s)"
rc=0
wait "$check" || rc=$?
tr '\r' '\n' < check.log
[ "$rc" = 0 ] || { echo "sinkflow figures --check (the wheel, from $repo) exited with $rc"; exit 1; }
echo "install check passed in $((SECONDS - start)) s"
