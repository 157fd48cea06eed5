"""Issue 29: chapter 4's genres outside Python, read from Debian packages (analysis.qevict.corpora).

Each source is parsed from a small .deb built here (ar + data.tar.xz, as Debian's), with a character
tokenizer, so these tests need neither the network nor a model; tests/test_qevict_main_documents.py
reads the registered packages themselves with the models' tokenizers."""
import gzip
import io
import struct
import tarfile
import zlib

import numpy as np
import pytest

from analysis import data
from analysis.qevict import corpora as C


class CharTokenizer:
    """One token per character (the tokenizer interface load_document uses)."""

    def encode(self, text):
        return np.array([ord(c) for c in text], np.int64)

    def token_to_str(self, i):
        return "\u010a" if chr(i) == "\n" else chr(i)


def _ar(members: dict) -> bytes:
    out = b"!<arch>\n"
    for name, body in members.items():
        out += f"{name + '/':<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(body):<10}`\n".encode() + body
        out += b"\n" if len(body) % 2 else b""
    return out


def _deb(files: dict, links: dict | None = None) -> bytes:
    """A .deb whose data.tar.xz holds ``files`` (path -> bytes) and symbolic ``links`` (path -> target)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        for path, body in files.items():
            info = tarfile.TarInfo("./" + path)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
        for path, target in (links or {}).items():
            info = tarfile.TarInfo("./" + path)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return _ar({"debian-binary": b"2.0\n", "control.tar.xz": b"", "data.tar.xz": buf.getvalue()})


def _ztext(books: list[str]) -> tuple[bytes, bytes]:
    bzs, bzz = b"", b""
    for xml in books:
        raw = xml.encode()
        z = zlib.compress(raw)
        bzs += struct.pack("<III", len(bzz), len(z), len(raw))
        bzz += z
    return bzs, bzz


GEN = ('<div canonical="true" osisID="Gen" sID="b1" type="book"/> <title type="main">Genesis</title> '
       '<div sID="p1" type="x-p"/><chapter n="1" osisID="Gen.1" sID="Gen.1"/><w lemma="strong:H1">In</w> '
       '<w lemma="strong:H2">the beginning</w>, <w>God</w><note placement="foot">a footnote</note>'
       '<w>created</w> light &amp; dark. <div eID="p1" type="x-p"/>'
       '<div canonical="true" eID="b1" osisID="Gen" '
       'type="book"/>')
PS = ('<div osisID="Ps" sID="b2" type="book"/><chapter osisID="Ps.1" sID="Ps.1"/><lg sID="g1"/>'
      '<l level="1" sID="l1"/>Blessed is the man,<l eID="l1" level="1"/><l level="2" sID="l2"/>nor stands.'
      '<l eID="l2" level="2"/><lg eID="g1"/>')
MATT = ('<div osisID="Matt" sID="b3" type="book"/><chapter osisID="Matt.1" sID="Matt.1"/>'
        'The book of the genealogy.')

ROFF = r""".\" SPDX-License-Identifier: Linux-man-pages-copyleft
.de XX
junk that is a macro definition
..
.TH TCP 7 2023-02-05 "Linux man-pages 6.03"
.SH NAME
tcp \- TCP protocol
.SH DESCRIPTION
This is
.B TCP
over
.BR ip (7),
see \fIsocket\fP(7) \(em really.  \" a comment
.PP
.nf
int fd = socket(AF_INET, SOCK_STREAM, 0);
.fi
.TS
tab(:);
l l.
a:b
.TE
.SS Options
.TP
.B TCP_NODELAY
Disable Nagle\[aq]s algorithm.
"""

FOLDOC_ENTRIES = [
    ("00-database-short", "00-database-short\n     The dictionary\n"),
    ("abort", "abort\n\n   <programming> To stop a {process}.\n\n   (1996-01-01)\n\n"),
    ("Ada", "Ada\n\n   <language> A {programming language}.\n\n"),
    ("bit", "bit\n\n   <unit> A binary digit.\n\n"),
    ("cat", "cat\n\n   <tool> Concatenate {files}.\n\n"),
]


def _b64(n: int) -> str:
    digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    s = ""
    while True:
        s = digits[n % 64] + s
        n //= 64
        if not n:
            return s


def _dictd() -> tuple[bytes, bytes]:
    text, index = b"", []
    for word, entry in FOLDOC_ENTRIES:
        body = entry.encode()
        index.append(f"{word}\t{_b64(len(text))}\t{_b64(len(body))}")
        if word == "Ada":  # an alias pointing at the same entry
            index.append(f"ada language\t{_b64(len(text))}\t{_b64(len(body))}")
        text += body
    return "\n".join(sorted(index)).encode() + b"\n", gzip.compress(text)


@pytest.fixture
def fixture_packages(monkeypatch):
    """The three Debian genres read from .debs built here instead of the registered packages."""
    bzs, bzz = _ztext(['<milestone type="x-importer"/>', GEN + PS])
    nbzs, nbzz = _ztext([MATT])
    index, dz = _dictd()
    m = C.MAN_DIR
    debs = {
        "debian_sword_text_web": _deb({f"{C.SWORD_MODULE}/ot.bzs": bzs, f"{C.SWORD_MODULE}/ot.bzz": bzz,
                                       f"{C.SWORD_MODULE}/nt.bzs": nbzs, f"{C.SWORD_MODULE}/nt.bzz": nbzz}),
        "debian_dict_foldoc": _deb({C.FOLDOC_INDEX: index, C.FOLDOC_DICT: dz}),
        "debian_manpages": _deb({f"{m}/man7/tcp.7.gz": gzip.compress(ROFF.encode()),
                                 f"{m}/man5/proc.5.gz": gzip.compress(b".TH PROC 5\n.SH NAME\nproc \\- x\n"),
                                 f"{m}/man7/udp.7.gz": gzip.compress(b".so man7/tcp.7\n")},
                                links={f"{m}/man7/ftm.7.gz": "tcp.7.gz"}),
    }
    monkeypatch.setattr(C, "_package_files", lambda name: C.deb_files(debs[name]))
    for f in (C.bible_books, C.foldoc_entries, C.man_pages):
        f.cache_clear()
    yield debs
    for f in (C.bible_books, C.foldoc_entries, C.man_pages):
        f.cache_clear()


def test_deb_archive_members():
    deb = _deb({"usr/share/a.txt": b"odd", "usr/share/b.txt": b"even"}, links={"usr/share/c.txt": "a.txt"})
    assert list(C.ar_members(deb)) == ["debian-binary", "control.tar.xz", "data.tar.xz"]
    assert C.deb_files(deb) == {"usr/share/a.txt": b"odd", "usr/share/b.txt": b"even"}  # the link left out
    with pytest.raises(ValueError, match="not an ar archive"):
        C.ar_members(b"PK\x03\x04")
    with pytest.raises(ValueError, match="no data.tar"):
        C.deb_files(_ar({"debian-binary": b"2.0\n"}))


def test_ztext_books_and_osis_text(fixture_packages):
    books = C.bible_books()
    assert list(books) == ["Gen", "Ps", "Matt"]  # canonical order, the New Testament after the Old
    gen = books["Gen"]
    assert gen.startswith("Genesis\n\nChapter 1\n\nIn the beginning, God created light")
    assert "footnote" not in gen and "<" not in gen and "light & dark." in gen
    assert books["Ps"] == "Chapter 1\n\nBlessed is the man,\nnor stands.\n"  # poetry: a line each
    text, source = C.bible_text("Gen+Matt")
    assert "Genesis" in text and "genealogy" in text and "sword-text-web" in source


def test_ztext_index_checks_sizes():
    bzs, bzz = _ztext(["<w>word</w>"])
    with pytest.raises(ValueError, match="index says"):
        C.ztext_blocks(bzs[:8] + struct.pack("<I", 99), bzz)
    with pytest.raises(ValueError, match="12-byte"):
        C.ztext_blocks(bzs[:10], bzz)


def test_dictd_entries_and_foldoc(fixture_packages):
    heads = [h for h, _ in C.foldoc_entries()]
    assert heads == ["abort", "Ada", "bit", "cat"]  # the header entry left out, the alias once
    text, source = C.encyclopaedia_text("a")
    assert "To stop a process." in text and "A programming language." in text and "binary" not in text
    assert "{" not in text and "dict-foldoc" in source
    assert "Concatenate files" in C.encyclopaedia_text("b-c")[0]
    assert C.dictd_number("B") == 1 and C.dictd_number("BA") == 64


def test_roff_text():
    t = C.roff_text(ROFF)
    assert t.startswith("TCP(7)\n\nNAME\ntcp - TCP protocol\n")
    assert "This is TCP over ip(7), see socket(7) \u2014 really." in t
    assert "int fd = socket(AF_INET, SOCK_STREAM, 0);\n" in t  # no-fill kept line by line
    assert "a  b" in t and "tab(:)" not in t  # table rows, not its format lines
    assert "TCP_NODELAY\nDisable Nagle's algorithm." in t
    assert "junk" not in t and "SPDX" not in t and "comment" not in t and "\\" not in t


def test_man_pages(fixture_packages):
    assert list(C.man_pages()) == ["proc.5", "tcp.7"]  # the link and the .so stub left out
    text, source = C.man_text("tcp.7+proc.5")
    assert "TCP protocol" in text and "proc - x" in text and "manpages" in source


@pytest.mark.parametrize("spec, listing", [
    ("lit:Nope", "Gen, Ps, Matt"), ("lit:Gen+", "books"), ("encyc:7", "a-z"), ("encyc:c-a", "a-z"),
    ("encyc:z", "no FOLDOC entry"), ("man:nope.7", "proc.5, tcp.7"), ("man:tcp", "proc.5, tcp.7"),
])
def test_bad_specs_say_what_exists(fixture_packages, spec, listing):
    with pytest.raises(ValueError, match=listing) as e:
        C.load_document(spec, CharTokenizer(), 10)
    assert spec.split(":", 1)[1].split("+")[0] in str(e.value)


def test_unknown_genre_lists_the_new_ones():
    with pytest.raises(ValueError, match="'lit:<name>'.*'encyc:<name>'.*'man:<name>'"):
        C.parse_spec("poem:x")


def test_documents_length_and_determinism(fixture_packages):
    tok = CharTokenizer()
    for spec in ("lit:Gen", "encyc:a", "man:tcp.7"):
        d = C.load_document(spec, tok, 40)
        assert len(d) == 40 and d.kind == spec.split(":")[0]
        assert C.load_document(spec, tok, 40).sha256 == d.sha256
        assert "Debian" in d.meta["source"]
        with pytest.raises(ValueError, match=f"{spec} has .* fewer than the 100000 needed"):
            C.load_document(spec, tok, 100_000)
    assert C.load_document("lit:Gen", tok, 40).sha256 != C.load_document("lit:Ps", tok, 20).sha256


def test_needle_with_named_modules_has_no_fallback():
    tok = CharTokenizer()
    d = C.load_document("needle:colorsys+shlex", tok, 800, prefill_tokens=600, n_needles=2, n_queries=1)
    hay = C.module_docstrings("colorsys") + "\n" + C.module_docstrings("shlex")
    assert len(d) == 800 and d.meta["haystack"] == "colorsys+shlex"
    assert "".join(chr(t) for t in d.tokens[:100]) == hay[:100]
    with pytest.raises(ValueError, match="too short .* join more modules"):
        C.load_document("needle:colorsys+shlex", tok, len(hay) + 500, prefill_tokens=len(hay), n_needles=2,
                        n_queries=1)


def test_document_sources_table():
    specs = ["code:typing", "lit:Gen", "lit:Job", "man:tcp.7", "lit:Gen"]
    t = C.document_sources(specs)
    assert list(t["genre"]) == [C.GENRE_LABELS[g] for g in ("code", "lit", "man")]
    assert list(t["documents (count)"]) == [1, 2, 1]  # each document once
    reg = data.registry()
    for kind, row in zip(("lit", "man"), t.iloc[1:].itertuples()):
        e = reg[C.DEBIAN_SOURCES[kind]]
        assert row[4] == f"Debian {e['package']} {e['version']}" and row.licence == e["licence"]
        assert e["url"].startswith("https://deb.debian.org/debian/pool/main/") and e["date"]
