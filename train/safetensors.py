"""A torch-free safetensors reader (memory-mapped, one array at a time) and writer.

The format: an 8-byte little-endian header length, a JSON header naming each tensor's dtype,
shape and byte range, then the raw little-endian data. numpy has no bfloat16 or float8, so those
come through ml_dtypes.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

import ml_dtypes
import numpy as np

DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
          "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2, "I64": np.int64, "I32": np.int32,
          "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
NAMES = {np.dtype(v): k for k, v in DTYPES.items()}


MAX_HEADER = 100_000_000
"""The safetensors library's own limit on the JSON header, in bytes."""


class NotSafetensors(ValueError):
    """The file does not start with a safetensors header (an image, a text file, a PyTorch pickle...)."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path} is not a readable safetensors file: {reason}")
        self.reason = reason


class SafetensorsFile:
    """The tensors of one .safetensors file: `shapes` from the header, `get(name)` reads one."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            size = self.path.stat().st_size
            with self.path.open("rb") as f:
                header, length = _header(self.path, f, size)
        except OSError as err:
            raise ValueError(f"cannot read {self.path}: {err}") from None
        self.metadata = header.pop("__metadata__", {}) or {}
        self.entries = header
        self.offset = 8 + length
        for name, entry in header.items():
            if entry.get("dtype") not in DTYPES:
                raise ValueError(f"{self.path}: tensor {name!r} has dtype {entry.get('dtype')!r}, which is not read "
                                 f"here ({', '.join(DTYPES)}); save the file in one of them")
            if self.offset + entry["data_offsets"][1] > size:
                raise ValueError(f"{self.path} is truncated: tensor {name!r} ends past the end of the file; download "
                                 "or copy it again")
        self.shapes = {name: tuple(entry["shape"]) for name, entry in header.items()}

    def get(self, name: str) -> np.ndarray:
        entry = self.entries[name]
        begin, end = entry["data_offsets"]
        dtype = np.dtype(DTYPES[entry["dtype"]])
        data = np.memmap(self.path, dtype=np.uint8, mode="r", offset=self.offset + begin, shape=(end - begin,))
        return np.asarray(data.view(dtype).reshape(entry["shape"]))


def _header(path: Path, file: BinaryIO, size: int) -> tuple[dict, int]:
    """The JSON header and its length from the start of `file`; NotSafetensors saying why not."""
    if size < 8:
        raise NotSafetensors(path, f"the file has {size} bytes, fewer than the 8 of a header length")
    (length,) = struct.unpack("<Q", file.read(8))
    if length > min(size - 8, MAX_HEADER):
        limit = f"the file has {size}" if length > size - 8 else f"the format allows at most {MAX_HEADER}"
        raise NotSafetensors(path, f"its first 8 bytes, read as the header length, say {length} bytes; {limit}")
    try:
        header = json.loads(file.read(length))
    except (ValueError, UnicodeDecodeError) as err:
        raise NotSafetensors(path, f"its header is not JSON ({err})") from None
    if not isinstance(header, dict) or not all(isinstance(e, dict) for e in header.values()):
        raise NotSafetensors(path, "its header is not a JSON object of tensor entries")
    return header, length


def write_safetensors(path: str | Path, tensors: Mapping[str, np.ndarray],
                      metadata: Mapping[str, str] | None = None) -> int:
    """Writes `tensors` in name order, as the safetensors library does; returns the data bytes."""
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
    with Path(path).open("wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for array in arrays.values():
            f.write(array.tobytes())
    return sum(a.nbytes for a in arrays.values())
