"""``--baseline REV`` of the benchmark scripts (benchmarks/_timing.py): whole runs of a script alternated
between this checkout's sinkflow and a git revision's, each recorded row's medians and ratio printed."""

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).parents[1]

SCRIPT = textwrap.dedent('''
    import sys
    sys.path.insert(0, {benchmarks!r})
    from _timing import compare_revisions, record

    def main(argv=None):
        argv = compare_revisions(__file__, argv)
        if argv is None:
            return
        import sinkflow
        assert argv == ["--size", "3"], argv
        record("row one: s", 2.0 if sinkflow.__file__.startswith({root!r}) else 4.0)
        record("row two: s", 1.0)

    main()
''')


def test_baseline_runs_the_script_with_both_packages_and_prints_each_rows_ratio(tmp_path):
    script = tmp_path / "bench_tiny.py"
    script.write_text(SCRIPT.format(benchmarks=str(ROOT / "benchmarks"), root=str(ROOT / "sinkflow")))
    out = subprocess.run([sys.executable, str(script), "--size", "3", "--baseline", "HEAD", "--rounds", "2"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:5]]
            for line in out.splitlines() if line.startswith("| row ") and "this checkout" not in line}
    # this checkout's package took 2 s, the revision's (extracted elsewhere) 4 s: ratio 0.5
    assert rows == {"row one: s": ["2", "4", "0.50x"], "row two: s": ["1", "1", "1.00x"]}, out
    assert "2 rounds" in out


def test_without_baseline_the_script_runs_alone_and_keeps_its_own_arguments(tmp_path):
    script = tmp_path / "bench_tiny.py"
    script.write_text(SCRIPT.format(benchmarks=str(ROOT / "benchmarks"), root=str(ROOT / "sinkflow")))
    records = tmp_path / "rows.json"
    subprocess.run([sys.executable, str(script), "--size", "3", "--records", str(records)], check=True, cwd=ROOT)
    assert records.read_text() == '{"row one: s": 2.0, "row two: s": 1.0}'
