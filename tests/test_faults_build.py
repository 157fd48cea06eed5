"""An interrupted book build (issue 31, item 4), on a tiny two-page book: Ctrl-C mid-chapter, then
``make book`` again finishes with the same output as an uninterrupted build and executes only the
page that had not finished; a cache entry an interruption left half written is removed, not read."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from analysis import build, execute

REPO = Path(__file__).resolve().parent.parent

PAGE = """---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---

# {title}

```{{code-cell}} ipython3
{code}
```
"""

INTRO = """\
from pathlib import Path
with open(Path.cwd().parent / "executions.log", "a") as fh:
    fh.write("intro\\n")
print("intro says", 6 * 7)"""

# the chapter that is running when Ctrl-C comes: it says it started, then waits to be let go
SLOW = """\
import time
from pathlib import Path
root = Path.cwd().parent
with open(root / "executions.log", "a") as fh:
    fh.write("slow\\n")
(root / "slow-started").write_text("")
t0 = time.time()
while not (root / "release").exists() and time.time() - t0 < 120:
    time.sleep(0.05)
print("slow says", sum(range(10)))"""

# a page queued behind the slow one: it must not start once Ctrl-C was pressed
AFTER = """\
from pathlib import Path
with open(Path.cwd().parent / "executions.log", "a") as fh:
    fh.write("after\\n")
print("after says", 2 ** 10)"""

# analysis.build on another book root (every module-level path under the repository moved there), with
# one executing process: the pages run in order, one queued behind the running one
DRIVER = """\
import sys
from pathlib import Path
from analysis import build as b
root, repo = Path(sys.argv[1]), b.REPO_ROOT
for name, value in list(vars(b).items()):
    if name.isupper() and isinstance(value, Path) and value.is_relative_to(repo):
        setattr(b, name, root / value.relative_to(repo))
sys.exit(b.main(["--no-strict", "--jobs", "1"]))
"""


def _book(root: Path) -> list[Path]:
    (root / "book").mkdir(parents=True)
    (root / "_config.yml").write_text(
        "title: t\nonly_build_toc_files: true\nexecute:\n  execute_notebooks: cache\n"
        "  cache: _build/.jupyter_cache\n  timeout: 300\n"
        "parse:\n  myst_enable_extensions: [colon_fence, dollarmath]\n")
    (root / "_toc.yml").write_text("format: jb-book\nroot: book/a_intro\nchapters:\n- file: book/b_slow\n"
                                   "- file: book/c_after\n")
    pages = []
    for name, code in (("a_intro", INTRO), ("b_slow", SLOW), ("c_after", AFTER)):
        p = root / "book" / f"{name}.md"
        p.write_text(PAGE.format(title=name, code=code))
        pages.append(p)
    return pages


def _use_root(monkeypatch, root: Path) -> None:
    """analysis.build's module-level paths under the repository, moved to ``root``."""
    repo = build.REPO_ROOT
    for name, value in list(vars(build).items()):
        if name.isupper() and isinstance(value, Path) and value.is_relative_to(repo):
            monkeypatch.setattr(build, name, root / value.relative_to(repo))


def _cache_a_page(root: Path, page: Path):
    """Cache ``page`` as executed (outputs written by hand: no kernel needed)."""
    import nbformat
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    nb = execute.read_page(page, root)
    for c in nb.cells:
        if c.cell_type == "code":
            c.outputs = [nbformat.v4.new_output("stream", name="stdout", text="cached output\n")]
            c.execution_count = 1
    cache = get_cache(str(root / "_build" / ".jupyter_cache"))
    cache.add_nb_to_project(str(page), read_data=execute.READ_DATA)
    return cache, cache.cache_notebook_bundle(CacheBundleIn(nb, str(page), data={}), check_validity=False,
                                              overwrite=True)


@pytest.mark.parametrize("damage", ["truncated", "missing"])
def test_a_half_written_cache_entry_is_removed_before_the_build(tmp_path, monkeypatch, capsys, damage):
    root = tmp_path / "b"
    intro, slow, _ = _book(root)
    _use_root(monkeypatch, root)
    build.invalidate(verbose=False)  # the keys of the pages recorded
    cache, rec = _cache_a_page(root, intro)
    _, other = _cache_a_page(root, slow)
    nb_file = Path(cache.path) / "executed" / rec.hashkey / "base.ipynb"
    if damage == "truncated":  # interrupted while jupyter-cache wrote the notebook
        nb_file.write_text(nb_file.read_text()[:200])
    else:  # interrupted after jupyter-cache recorded the page, before it wrote the notebook
        shutil.rmtree(nb_file.parent)
    with pytest.raises(Exception):  # what the build would meet: the page's record cannot be read
        cache.merge_match_into_notebook(execute.read_page(intro, root))
    assert [r.pk for r in build.broken_records(cache)] == [rec.pk]
    build.invalidate()
    assert "removed a half-written cache entry of a_intro.md" in capsys.readouterr().out
    assert [r.pk for r in cache.list_cache_records()] == [other.pk]  # the intact entry is kept
    assert execute.pending([intro, slow], build.JCACHE, root) == [intro]  # executes again
    assert not (Path(cache.path) / "executed" / rec.hashkey).exists()


def test_a_changed_page_whose_cache_file_is_missing_does_not_stop_the_build(tmp_path, monkeypatch):
    """jupyter-cache's own remove_cache raises KeyError when the notebook file is missing."""
    root = tmp_path / "b"
    intro, _, _ = _book(root)
    _use_root(monkeypatch, root)
    build.invalidate(verbose=False)
    cache, rec = _cache_a_page(root, intro)
    keys = json.loads(build.KEYS.read_text())
    keys["book/a_intro.md"] = {"analysis/gone.py": "0" * 64}  # its key changed since
    build.KEYS.write_text(json.dumps(keys))
    shutil.rmtree(Path(cache.path) / "executed" / rec.hashkey)
    monkeypatch.setattr(build, "broken_records", lambda cache: [])  # the key change alone removes it
    changed = build.invalidate(verbose=False)
    assert list(changed) == ["book/a_intro.md"] and cache.list_cache_records() == []


def _outputs(html: Path) -> list[str]:
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html.read_text(), "html.parser")
    return [d.get_text().strip() for d in soup.select("div.cell_output")]


def _group_gone(pgid: int, wait_s: float = 20.0) -> bool:
    t0 = time.time()
    while time.time() - t0 < wait_s:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow
def test_an_interrupted_build_resumes_with_the_same_output(tmp_path):
    root, ref = tmp_path / "b", tmp_path / "ref"
    intro, slow, after = _book(root)
    _book(ref)
    (tmp_path / "driver.py").write_text(DRIVER)
    env = dict(os.environ, PYTHONPATH=str(REPO), PYDEVD_DISABLE_FILE_VALIDATION="1")
    cmd = [sys.executable, str(tmp_path / "driver.py")]
    jcache = root / "_build" / ".jupyter_cache"
    log = root / "executions.log"
    # 1. the build executes the pages one after another; Ctrl-C (SIGINT to the terminal's process group)
    #    while the second runs, the first cached and the third queued
    # SIGINT at its default in the build (a process started with SIGINT ignored, as a test run in the
    # background is, passes that on, and Python then never raises KeyboardInterrupt)
    p = subprocess.Popen(cmd + [str(root)], cwd=tmp_path, env=env, start_new_session=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        t0 = time.time()
        while time.time() - t0 < 180 and p.poll() is None and not (root / "slow-started").exists():
            time.sleep(0.1)
        assert p.poll() is None, p.stdout.read()
        time.sleep(0.5)
        os.killpg(p.pid, signal.SIGINT)
        out, _ = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130, out
    assert "build interrupted" in out and "executes only the others" in out
    assert _group_gone(p.pid), "a process of the interrupted build (a kernel, a worker) is still running"
    assert execute.pending([intro, slow, after], jcache, root) == [slow, after]  # the finished page is cached
    assert log.read_text().split() == ["intro", "slow"]  # the queued page never started
    # 2. `make book` again: only the pages that had not finished execute; the book is rendered
    for r in (root, ref):
        (r / "release").write_text("")
    again = subprocess.run(cmd + [str(root)], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "reuse      a_intro" in again.stdout
    assert "executing 2 page(s) in 1 process(es): b_slow, c_after" in again.stdout
    assert log.read_text().split() == ["intro", "slow", "slow", "after"]
    # 3. the same output as a build that was never interrupted
    clean = subprocess.run(cmd + [str(ref)], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=300)
    assert clean.returncode == 0, clean.stdout[-3000:] + clean.stderr[-3000:]
    for page in ("a_intro", "b_slow", "c_after"):
        got, want = (_outputs(r / "_build" / "html" / "book" / f"{page}.html") for r in (root, ref))
        assert got == want and got, page
    assert _outputs(root / "_build" / "html" / "book" / "b_slow.html") == ["slow says 45"]
