"""The build's failure report: exception line, last frames and hints (analysis.build)."""
from analysis import build

# the shape of a page's traceback report (_build/html/reports/<page>.err.log), colours included
REPORT = """Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/jupyter_cache/executors/utils.py", line 58, in single_nb_execution
    executenb(
nbclient.exceptions.CellExecutionError: An error occurred while executing the following cell:
------------------
from analysis import data
data.path("mooncake_conversation")
------------------


\x1b[31m---------------------------------------------------------------------------\x1b[39m
\x1b[31mDataError\x1b[39m                                 Traceback (most recent call last)
\x1b[36mCell\x1b[39m\x1b[36m \x1b[39m\x1b[32mIn[2]\x1b[39m\x1b[32m, line 2\x1b[39m
\x1b[32m      1\x1b[39m from analysis import data
\x1b[32m----> \x1b[39m\x1b[32m2\x1b[39m data.path("mooncake_conversation")

\x1b[36mFile \x1b[39m\x1b[32m/repo/analysis/traces.py:173\x1b[39m, in \x1b[36mresolve\x1b[39m(s)
\x1b[32m--> \x1b[39m\x1b[32m173\x1b[39m return data.path(s)

File \x1b[32m/repo/analysis/data.py:117\x1b[39m, in \x1b[36mpath\x1b[39m(name, download)
\x1b[32m    116\x1b[39m searched = ", ".join(candidates(mirror))
\x1b[32m--> \x1b[39m\x1b[32m117\x1b[39m raise DataError(

\x1b[31mDataError\x1b[39m: data file 'mooncake_conversation' not found (downloads disabled by KVBOOK_OFFLINE).
[IPKernelApp] WARNING | Kernel is running over TCP without encryption.
"""


def test_failure_summary_has_exception_frames_and_hint():
    s = build.summarize_failure(REPORT, n_frames=2)
    assert s["exception"] == "DataError: data file 'mooncake_conversation' not found (downloads disabled " \
                             "by KVBOOK_OFFLINE)."
    assert len(s["frames"]) == 2  # the last two of three
    assert s["frames"][0].startswith("File /repo/analysis/traces.py:173, in resolve(s)")
    assert "--> 173 return data.path(s)" in s["frames"][0]
    assert s["frames"][1].startswith("File /repo/analysis/data.py:117, in path")
    assert "make data" in s["hint"] and "KVBOOK_DATA" in s["hint"]
    assert "\x1b" not in repr(s)


def test_failure_without_a_cell_traceback_and_unknown_error():
    text = ("Traceback (most recent call last):\n  File \"x.py\", line 3, in run\n    go()\n"
            "nbclient.exceptions.DeadKernelError: Kernel died\n")
    s = build.summarize_failure(text)
    assert s["exception"] == "nbclient.exceptions.DeadKernelError: Kernel died"
    assert s["frames"] == ['File "x.py", line 3, in run']
    assert "memory" in s["hint"]
    assert build.summarize_failure("ZeroDivisionError: division by zero")["hint"] is None


def test_failures_are_printed_per_page(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(build, "REPORTS", tmp_path)
    (tmp_path / "book").mkdir()
    (tmp_path / "book" / "02_ssd_offload.err.log").write_text(REPORT)
    failures = build.failure_reports()
    assert list(failures) == ["book/02_ssd_offload"]
    build.print_failures(failures)
    out = capsys.readouterr().out
    assert "FAILED book/02_ssd_offload" in out and "DataError: data file" in out and "make data" in out
