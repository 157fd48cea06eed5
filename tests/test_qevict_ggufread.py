"""analysis.qevict.ggufread against gguf.GGUFReader (the reader it replaces): every metadata field and
every tensor's bytes, dtype and shape agree on a file written with gguf.GGUFWriter (every value type;
F32, F16, I32 and Q4_K tensors) and on SmolLM2's real file; bad files get a clear error."""
import os
import time

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from analysis.qevict import ggufread  # noqa: E402
from analysis.qevict.ggufread import GGUFError, read_gguf  # noqa: E402

T = gguf.GGUFValueType
Q4_K = gguf.GGMLQuantizationType.Q4_K

SCALARS = [  # (key, writer method, value): each type's extremes
    ("t.u8", "add_uint8", 255), ("t.i8", "add_int8", -128), ("t.u16", "add_uint16", 65535),
    ("t.i16", "add_int16", -32768), ("t.u32", "add_uint32", 2**32 - 1), ("t.i32", "add_int32", -2**31),
    ("t.u64", "add_uint64", 2**64 - 1), ("t.i64", "add_int64", -2**63), ("t.f32", "add_float32", 0.1),
    ("t.f64", "add_float64", 0.1), ("t.true", "add_bool", True), ("t.false", "add_bool", False),
    ("t.str", "add_string", "naïve ▁tokens 🚀\n"),
]
ARRAYS = [  # (key, values, element type or None for the writer's default)
    ("a.i32", [1, -2, 3, 2**31 - 1], None), ("a.u8", [0, 7, 255], T.UINT8), ("a.i64", [-2**63, 5], T.INT64),
    ("a.u64", [2**64 - 1, 0], T.UINT64), ("a.f32", [0.1, -2.5, 1e30], None),
    ("a.f64", [0.1, 1e300], T.FLOAT64),
    ("a.bool", [True, False, True], None), ("a.str", ["a", "", "Ġthe", "<0x0A>", "▁▁", "日本"], None),
]
NESTED = [[1, 2], [3, 4, 5]]


def tensors_to_write(rng):
    return {
        "w.f32": rng.standard_normal((3, 5)).astype(np.float32),
        "w.f16": rng.standard_normal((2, 8)).astype(np.float16),
        "w.i32": rng.integers(-9, 9, (4,)).astype(np.int32),
        "w.q4k": rng.integers(0, 256, (2, 144), dtype=np.uint8),  # two Q4_K blocks: 2 rows of 256 weights
        "w.vec": rng.standard_normal(7).astype(np.float32),
    }


def write_sample(path, alignment=None, tokens=None, seed=0):
    w = gguf.GGUFWriter(str(path), "test")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for key, method, value in SCALARS:
        getattr(w, method)(key, value)
    for key, values, etype in ARRAYS:
        w.add_key_value(key, values, T.ARRAY, sub_type=etype)
    w.add_key_value("a.nested", NESTED, T.ARRAY, sub_type=T.ARRAY)
    if tokens is not None:
        w.add_array("tokenizer.ggml.tokens", tokens)
    written = tensors_to_write(np.random.default_rng(seed))
    for name, arr in written.items():
        w.add_tensor(name, arr, raw_dtype=Q4_K if name == "w.q4k" else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return written


def assert_same_as_gguf_reader(path):
    """Every field (value and type) and every tensor (bytes, dtype, shape, type, offset) agree."""
    old, new = gguf.GGUFReader(path), read_gguf(path)
    keys = [k for k in old.fields if not k.startswith("GGUF.")]  # GGUFReader's pseudo-fields of the header
    assert keys == list(new.fields)
    assert new.version == old.fields["GGUF.version"].contents()
    for k in keys:
        a, b = old.fields[k].contents(), new.fields[k]
        types = [int(t) for t in old.fields[k].types]
        assert list(new.field_types[k][:len(types)]) == types, k
        if isinstance(b, np.ndarray):
            assert b.tolist() == a, k
            assert b.dtype == old.fields[k].parts[old.fields[k].data[0]].dtype, k
        elif types[:2] == [T.ARRAY, T.ARRAY]:  # an array of arrays: GGUFReader flattens it
            assert [x for sub in b for x in np.asarray(sub).tolist()] == a, k
        else:
            assert type(b) is type(a) and b == a, k
    assert [t.name for t in old.tensors] == list(new.tensors)
    assert new.data_offset == old.data_offset and new.alignment == old.alignment
    for t in old.tensors:
        u = new.tensors[t.name]
        assert u.tensor_type == int(t.tensor_type) and u.type_name == t.tensor_type.name
        assert u.dims == tuple(t.shape.tolist()) and u.shape == tuple(reversed(t.shape.tolist()))
        assert (u.data_offset, u.n_bytes, u.n_elements) == (t.data_offset, t.n_bytes, t.n_elements)
        assert u.data.dtype == t.data.dtype and u.data.shape == t.data.shape, t.name
        assert u.data.tobytes() == t.data.tobytes(), t.name
        assert not u.data.flags.writeable
    return new


@pytest.mark.parametrize("alignment", [None, 64])
def test_every_value_type_and_tensor_type_as_gguf_reader(tmp_path, alignment):
    path = tmp_path / "sample.gguf"
    written = write_sample(path, alignment)
    g = assert_same_as_gguf_reader(path)
    for key, _, value in SCALARS:
        assert g.fields[key] == (np.float32(value).item() if key == "t.f32" else value), key
        assert type(g.fields[key]) is type(value)
    for key, values, etype in ARRAYS:
        want = np.asarray(values, dtype=np.float32).tolist() if key == "a.f32" else values
        got = g.fields[key]
        assert (got.tolist() if isinstance(got, np.ndarray) else got) == want, key
    assert g.fields["a.str"] == ARRAYS[-1][1] and [a.tolist() for a in g.fields["a.nested"]] == NESTED
    assert [g.fields["a.nested"][i].dtype for i in range(2)] == [np.int32] * 2
    # the tensors hold the bytes that were written, at offsets aligned as declared (default 32)
    align = alignment or 32
    assert g.alignment == align and g.data_offset % align == 0
    for name, arr in written.items():
        t = g.tensors[name]
        assert (t.data_offset - g.data_offset) % align == 0
        assert t.data.tobytes() == arr.tobytes(), name
    q = g.tensors["w.q4k"]
    assert q.type_name == "Q4_K" and q.shape == (2, 256)
    assert q.data.shape == (2, 144) and q.data.dtype == np.uint8
    assert g.tensors["w.f16"].data.dtype == np.float16 and g.tensors["w.f16"].shape == (2, 8)
    assert g.tensors["w.vec"].dims == (7,)


def test_dequantized_weights_equal_through_both_readers(tmp_path):
    """What the models do with a tensor: gguf.quants.dequantize of its data, reshaped to ``shape``."""
    from gguf.quants import dequantize

    path = tmp_path / "sample.gguf"
    write_sample(path)
    old = {t.name: t for t in gguf.GGUFReader(path).tensors}
    for name, t in read_gguf(path).tensors.items():
        if t.type_name == "I32":
            continue  # not a weight type: dequantize does not take it
        a = dequantize(old[name].data, old[name].tensor_type)
        b = dequantize(t.data, gguf.GGMLQuantizationType(t.tensor_type))
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), name
        assert b.reshape(t.shape).shape == tuple(int(x) for x in reversed(old[name].shape.tolist()))


def test_large_string_array_is_read_fast(tmp_path):
    """A 262,144-entry vocabulary (Gemma 3's size) is one pass of struct reads, not a view per entry."""
    tokens = [f"tok{i}" for i in range(262_144)]
    path = tmp_path / "vocab.gguf"
    write_sample(path, tokens=tokens)
    t0 = time.perf_counter()
    g = read_gguf(path)
    assert time.perf_counter() - t0 < 5.0  # gguf.GGUFReader: about 10 s idle, 30 s on loaded cores
    assert g.fields["tokenizer.ggml.tokens"] == tokens


@pytest.mark.real_weights
def test_smollm2_file_as_gguf_reader():
    from analysis.qevict.gguf_model import gguf_path

    try:
        path = gguf_path()
    except FileNotFoundError as e:  # pragma: no cover
        pytest.skip(str(e))
    g = assert_same_as_gguf_reader(path)
    assert len(g.tensors) > 100 and len(g.fields["tokenizer.ggml.tokens"]) == g.fields["llama.vocab_size"]


# ------------------------------------------------------------------------------------------- bad input

def test_missing_file(tmp_path):
    path = tmp_path / "absent.gguf"
    with pytest.raises(FileNotFoundError, match="absent.gguf"):
        read_gguf(path)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    with pytest.raises(GGUFError, match="empty.gguf.*empty"):
        read_gguf(path)


@pytest.mark.parametrize("head", [b"PK\x03\x04" + bytes(60), b"GGU", b"{\"not\": \"gguf\"}"])
def test_not_a_gguf_file(tmp_path, head):
    path = tmp_path / "other.bin"
    path.write_bytes(head)
    with pytest.raises(GGUFError, match="other.bin: not a GGUF file"):
        read_gguf(path)
    assert issubclass(GGUFError, ValueError)


@pytest.mark.parametrize("version", [1, 4, 0x03000000])
def test_unsupported_version(tmp_path, version):
    path = tmp_path / "sample.gguf"
    write_sample(path)
    raw = bytearray(path.read_bytes())
    raw[4:8] = version.to_bytes(4, "little")
    path.write_bytes(bytes(raw))
    with pytest.raises(GGUFError, match="sample.gguf: (GGUF version|big-endian)") as e:
        read_gguf(path)
    assert ("big-endian" in str(e.value)) == (version == 0x03000000)


def test_truncated_header(tmp_path):
    """Cut anywhere in the header (magic excepted): inside the counts, a key, a string, an array of
    strings, the tensor table."""
    full = tmp_path / "sample.gguf"
    write_sample(full, tokens=["x", "yy", "zzz"] * 10)
    g = read_gguf(full)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(full.read_bytes())
    for n in range(g.data_offset - g.alignment, 3, -1):  # every length, shortening the same file
        os.truncate(cut, n)
        with pytest.raises(GGUFError, match="cut.gguf: truncated header"):
            read_gguf(cut)


def test_truncated_tensor_data(tmp_path):
    full = tmp_path / "sample.gguf"
    write_sample(full)
    g = read_gguf(full)
    raw = full.read_bytes()
    cut = tmp_path / "cut.gguf"
    for t in g.tensors.values():
        cut.write_bytes(raw[:t.data_offset + t.n_bytes - 1])
        with pytest.raises(GGUFError, match=f"cut.gguf: truncated tensor data: tensor '{t.name}'"):
            read_gguf(cut)
    cut.write_bytes(raw[:g.data_offset])
    with pytest.raises(GGUFError, match="truncated tensor data"):
        read_gguf(cut)


def test_bad_alignment_and_unknown_types(tmp_path, monkeypatch):
    path = tmp_path / "sample.gguf"
    write_sample(path, alignment=64)
    raw = bytearray(path.read_bytes())
    at = raw.index(b"general.alignment") + len("general.alignment") + 4  # after the key and its type
    assert raw[at:at + 4] == (64).to_bytes(4, "little")
    raw[at:at + 4] = (48).to_bytes(4, "little")
    path.write_bytes(bytes(raw))
    with pytest.raises(GGUFError, match="general.alignment is 48"):
        read_gguf(path)
    write_sample(path)
    monkeypatch.delitem(ggufread.GGML_TYPES, int(Q4_K))
    with pytest.raises(GGUFError, match="tensor 'w.q4k' has unknown ggml type 12"):
        read_gguf(path)


def test_error_messages_say_what_to_do(tmp_path):
    path = tmp_path / "sample.gguf"
    write_sample(path)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(GGUFError) as e:
        read_gguf(os.fspath(path))
    assert str(path) in str(e.value) and "download or assemble it again" in str(e.value)
