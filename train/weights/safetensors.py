"""A torch-free safetensors reader (memory-mapped, one array at a time) and writer.

The format: an 8-byte little-endian header length, a JSON header naming each tensor's dtype,
shape and byte range, then the raw little-endian data. numpy has no bfloat16 or float8, so those
come through ml_dtypes. A file may come from anywhere: its header is checked whole (length,
types, sizes, byte ranges) before any tensor is read.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from itertools import pairwise
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import ml_dtypes
import numpy as np
from triskele.train.bookkeeping.files import atomic_file

DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
          "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2, "I64": np.int64, "I32": np.int32,
          "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
NAMES = {np.dtype(v): k for k, v in DTYPES.items()}


MAX_HEADER = 4 << 20
"""The largest JSON header read, in bytes (4 MiB): over 20x the header of the largest ViT releases
(~150 KB for 48 blocks), and at most ~100 MB of memory to parse whatever JSON it holds; the length
is checked before the header is read. (The safetensors library allows 100 MB.)"""

MAX_DIMS = 32
"""The most dimensions a tensor may have (numpy's own limit before 2.0)."""


class NotSafetensors(ValueError):
    """The file does not start with a safetensors header (an image, a text file, a PyTorch pickle...)."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path} is not a readable safetensors file: {reason}")
        self.reason = reason


class Tensor(NamedTuple):
    """One header entry, checked: its dtype, shape and byte range in the data section."""

    dtype: np.dtype
    shape: tuple[int, ...]
    begin: int
    end: int


class SafetensorsFile:
    """The tensors of one .safetensors file: `shapes` from the header, `get(name)` reads one.

    The whole header is checked when the file is opened, so that no tensor read later can reach
    outside its own bytes: a ValueError naming the file and the entry says what is wrong."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            size = self.path.stat().st_size
            with self.path.open("rb") as f:
                header, length = _header(self.path, f, size)
        except OSError as err:
            raise ValueError(f"cannot read {self.path}: {err}") from None
        self.offset = 8 + length
        self.metadata = _metadata(self.path, header.pop("__metadata__", None) or {})
        self.entries = {name: _tensor(self.path, name, entry, size - self.offset) for name, entry in header.items()}
        _check_disjoint(self.path, self.entries)
        self.shapes = {name: tensor.shape for name, tensor in self.entries.items()}

    def get(self, name: str) -> np.ndarray:
        tensor = self.entries[name]
        data = np.memmap(self.path, dtype=np.uint8, mode="r", offset=self.offset + tensor.begin,
                         shape=(tensor.end - tensor.begin,))
        return np.asarray(data.view(tensor.dtype).reshape(tensor.shape))


def _header(path: Path, file: BinaryIO, size: int) -> tuple[dict, int]:
    """The JSON header and its length from the start of `file`; NotSafetensors saying why not.
    The length is checked against the file's size and MAX_HEADER before the header is read."""
    if size < 8:
        raise NotSafetensors(path, f"the file has {size} bytes, fewer than the 8 of a header length")
    (length,) = struct.unpack("<Q", file.read(8))
    if length > min(size - 8, MAX_HEADER):
        limit = (f"the file has {size}" if length > size - 8 else
                 f"this reader takes headers of at most {MAX_HEADER} bytes (a ViT's is under 200 KB)")
        raise NotSafetensors(path, f"its first 8 bytes, read as the header length, say {length} bytes; {limit}")
    try:
        header = json.loads(file.read(length))
    except (ValueError, UnicodeDecodeError) as err:
        raise NotSafetensors(path, f"its header is not JSON ({err})") from None
    except RecursionError:
        raise NotSafetensors(path, "its header is not a JSON object of tensor entries (it nests deeper than "
                                   "Python parses)") from None
    if not isinstance(header, dict) or not all(isinstance(e, dict) for k, e in header.items() if k != "__metadata__"):
        raise NotSafetensors(path, "its header is not a JSON object of tensor entries")
    return header, length


def _invalid(path: Path, what: str) -> ValueError:
    return ValueError(f"{path} is not a valid safetensors file: {what}; the file is damaged or was not written by "
                      "a safetensors writer")


def _metadata(path: Path, metadata: Any) -> dict[str, str]:
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise _invalid(path, "its __metadata__ is not an object of strings to strings")
    return metadata


def _natural(value: Any) -> bool:
    """A JSON integer >= 0 (JSON's true and false are not counts)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _tensor(path: Path, name: str, entry: dict, data_size: int) -> Tensor:
    """`entry` checked: a known dtype, a shape of non-negative integers, and [begin, end] inside the
    data section (of `data_size` bytes) holding exactly the shape's bytes."""
    missing = [key for key in ("dtype", "shape", "data_offsets") if key not in entry]
    if missing:
        raise _invalid(path, f"tensor {name!r} has no {' and no '.join(missing)}")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise ValueError(f"{path}: tensor {name!r} has dtype {_short(dtype)}, which is not read here "
                         f"({', '.join(DTYPES)}); save the file in one of them")
    if not (isinstance(shape, list) and len(shape) <= MAX_DIMS and all(_natural(d) for d in shape)):
        raise _invalid(path, f"tensor {name!r} has shape {_short(shape)}, not a list of at most {MAX_DIMS} "
                             "non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_natural(o) for o in offsets)
            and offsets[0] <= offsets[1]):
        raise _invalid(path, f"tensor {name!r} has data_offsets {_short(offsets)}, not [begin, end] with "
                             "0 <= begin <= end")
    begin, end = offsets
    itemsize = np.dtype(DTYPES[dtype]).itemsize
    if math.prod(shape) * itemsize != end - begin:
        raise _invalid(path, f"tensor {name!r} of shape {shape} and dtype {dtype} has {math.prod(shape) * itemsize} "
                             f"bytes, but its data_offsets [{begin}, {end}] hold {end - begin}")
    if end > data_size:
        raise ValueError(f"{path} is truncated: tensor {name!r} ends past the end of the file; download "
                         "or copy it again")
    if 0 in shape and math.prod(d for d in shape if d) > max(data_size, 1):  # numpy could not even shape it
        raise _invalid(path, f"empty tensor {name!r} has shape {_short(shape)}, whose other dimensions are more "
                             "elements than the file has bytes")
    return Tensor(np.dtype(DTYPES[dtype]), tuple(shape), begin, end)


def _check_disjoint(path: Path, tensors: Mapping[str, Tensor]) -> None:
    """No two tensors share a byte (empty ones have none)."""
    ranges = sorted((t.begin, t.end, name) for name, t in tensors.items() if t.end > t.begin)
    for (_, end, first), (begin, _, second) in pairwise(ranges):
        if begin < end:
            raise _invalid(path, f"tensors {first!r} and {second!r} overlap (bytes {begin} to {end} of the data)")


def write_safetensors(path: str | Path, tensors: Mapping[str, np.ndarray],
                      metadata: Mapping[str, str] | None = None) -> int:
    """Writes `tensors` in name order, as the safetensors library does (atomically, never through a
    link planted at `path`); returns the data bytes."""
    header, offset = {}, 0
    arrays = {}
    for name in sorted(tensors):
        array = np.ascontiguousarray(tensors[name])
        if array.dtype not in NAMES:
            raise ValueError(f"tensor {name!r} has dtype {array.dtype}, which safetensors does not store")
        arrays[name] = array
        header[name] = {"dtype": NAMES[array.dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    if metadata:
        header["__metadata__"] = dict(metadata)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # align the data to 8 bytes
    with atomic_file(Path(path)) as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for array in arrays.values():
            f.write(array.tobytes())
    return sum(a.nbytes for a in arrays.values())
