"""Packed datasets: a domain's splits as ArrayRecord shards (Grain's random-access format) of records
decoded once, at training resolution, in the form training reads before augmentation.

`python -m triskele.train pack` writes them (`triskele.train.tools.pack`), each shard whole under a
temporary name and then renamed, so a reader never sees half a shard; a run whose `data.path`
is a packed folder reads them in place of the tree, through the same global order, the same
per-record augmentation keyed on (seed, epoch, index) and the same resume, so the same run gives the
same numbers on a tree and on its pack.

A packed folder holds `pack.json` (the manifest: the domain, the source tree, the config keys that
shaped the records and their values, each split's record count, shards and metadata, and a hash of
every shard) and `<split>/shard-NNNNN.array_record`. Each record is one `encode_record` blob: a JSON
header naming each array's dtype, shape and codec, then the arrays' bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import struct
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

MANIFEST = "pack.json"
FORMAT = 1
"""The packed layout's version, in the manifest: a reader refuses another."""
SHARD_SUFFIX = ".array_record"
CODECS = ("raw", "zlib", "png")
"""How an array's bytes are stored: as they are, deflated (zlib level 1), or as a PNG (2-D or 3-D
uint8 arrays of 1 or 3 channels)."""


def is_packed(path: str | Path | None) -> bool:
    """Whether `data.path` names a packed folder (one holding `pack.json`)."""
    return path is not None and (Path(path) / MANIFEST).is_file()


def _png(array: np.ndarray) -> bytes:
    import cv2

    ok, encoded = cv2.imencode(".png", np.ascontiguousarray(array[..., ::-1] if array.ndim == 3 else array),
                               [cv2.IMWRITE_PNG_COMPRESSION, 1])
    if not ok:
        raise ValueError(f"cannot encode a {array.shape} {array.dtype} array as PNG")
    return encoded.tobytes()


def _unpng(data: bytes, shape: tuple[int, ...]) -> np.ndarray:
    import cv2

    decoded = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    return (decoded[..., ::-1] if decoded.ndim == 3 else decoded).reshape(shape)


def encode_record(record: Mapping[str, np.ndarray], codecs: Mapping[str, str] | None = None) -> bytes:
    """One record's arrays as bytes; `codecs`: array name -> one of `CODECS` (default raw)."""
    header, payloads = {}, []
    for name, value in record.items():
        array = np.asarray(value)  # tobytes() writes C order whatever the strides
        codec = (codecs or {}).get(name, "raw")
        if codec == "png" and (array.dtype != np.uint8 or array.ndim not in (2, 3)
                               or (array.ndim == 3 and array.shape[-1] not in (1, 3))):
            codec = "zlib"  # PNG holds 8-bit grey or RGB only
        data = array.tobytes()
        data = zlib.compress(data, 1) if codec == "zlib" else _png(array) if codec == "png" else data
        header[name] = [array.dtype.str, list(array.shape), codec, len(data)]
        payloads.append(data)
    head = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<I", len(head)) + head + b"".join(payloads)


def decode_record(blob: bytes, where: str) -> dict[str, np.ndarray]:
    """The arrays of an `encode_record` blob; ValueError naming `where` (a shard and index) when it
    is not one."""
    try:
        (size,) = struct.unpack_from("<I", blob)
        header = json.loads(blob[4 : 4 + size])
        offset, record = 4 + size, {}
        for name, (dtype, shape, codec, length) in header.items():
            data = blob[offset : offset + length]
            offset += length
            if codec == "png":
                record[name] = _unpng(data, tuple(shape))
                continue
            raw = zlib.decompress(data) if codec == "zlib" else data
            record[name] = np.frombuffer(raw, np.dtype(dtype)).reshape(shape)
        if offset != len(blob):
            raise ValueError(f"{len(blob) - offset} bytes past its arrays")
        return record
    except (struct.error, ValueError, KeyError, TypeError, zlib.error, AttributeError) as err:
        raise ValueError(f"packed record {where} is damaged or not a triskele record ({err}); pack the data "
                         "again") from None


def read_manifest(root: str | Path) -> dict[str, Any]:
    """The packed folder's manifest, checked to be one of this format."""
    path = Path(root) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"packed data {root}: cannot read {path} ({err}); pack the data again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"{path} is not a triskele pack manifest of format {FORMAT}; pack the data again with "
                         "this version")
    return manifest


def packed_value(root: str | Path, key: str) -> Any:
    """The value the shaping key `key` had when `root` was packed (a run starting on a pack takes
    the data-dependent options it would have read from the tree, such as mars.scale, from here)."""
    return read_manifest(root)["shaping"].get(key)


def shaping(config: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    """The values of the shaping `keys` in `config` (the domain's `pack_keys`)."""
    from triskele.train.config.schema import config_values

    values = config_values(config)
    return {key: values[key] for key in keys}


def open_packed(config: Any, split: str, keys: tuple[str, ...]) -> PackedRecords:
    """`split` of the packed folder `config.data.path`, refused unless it was shaped as `config` shapes it."""
    return PackedRecords.open(config.data.path, split, shaping(config, keys))


def shaping_differences(packed: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
    """The shaping keys whose values differ ('mars.scale: packed 0.5, this run 1.0')."""
    return [f"{key}: packed {packed.get(key)!r}, this run {wanted.get(key)!r}"
            for key in sorted(set(packed) | set(wanted)) if packed.get(key) != wanted.get(key)]


def check_shaping(root: str | Path, manifest: Mapping[str, Any], wanted: Mapping[str, Any]) -> None:
    """Refuses a packed folder whose records were shaped by other config values than the run's,
    naming each key."""
    differ = shaping_differences(manifest["shaping"], wanted)
    if differ:
        raise ValueError(f"packed data {root} was packed with other values of the keys that shape its records: "
                         f"{'; '.join(differ)}. Pack the tree ({manifest.get('source')}) again with this run's "
                         "values, or set them as packed")


def shard_name(index: int) -> str:
    return f"shard-{index:05d}{SHARD_SUFFIX}"


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def write_shard(path: Path, blobs: list[bytes]) -> None:
    """`blobs` as one ArrayRecord shard at `path`, which appears whole or not at all (written under a
    temporary name in its folder, then renamed)."""
    from array_record.python.array_record_module import ArrayRecordWriter
    from triskele.train.bookkeeping.files import atomic_path

    with atomic_path(path) as temp:
        writer = ArrayRecordWriter(temp, "group_size:1,uncompressed")  # the records' codecs compress
        for blob in blobs:
            writer.write(blob)
        writer.close()


@dataclasses.dataclass
class PackedRecords:
    """One split of a packed folder: record i's arrays before augmentation (`decoded`), read from its
    shards (opened lazily in each process: the reader pickles as its paths), and the split's metadata."""

    root: Path
    split: str
    records: int
    shards: list[str]
    meta: dict[str, Any]

    def __post_init__(self) -> None:
        self._source = None

    @classmethod
    def open(cls, root: str | Path, split: str, wanted: Mapping[str, Any]) -> PackedRecords:
        """The packed `split` of `root`, refused unless its shaping keys equal `wanted` and its shards
        are all there."""
        root = Path(root)
        manifest = read_manifest(root)
        check_shaping(root, manifest, wanted)
        splits = manifest["splits"]
        if split not in splits or not splits[split].get("complete"):
            packed = ", ".join(s for s, v in splits.items() if v.get("complete")) or "none"
            raise ValueError(f"packed data {root} has no complete split {split!r} (packed: {packed}); run pack again "
                             "to finish it")
        entry = splits[split]
        for name in entry["shards"]:
            if not (root / split / name).is_file():
                raise ValueError(f"packed data {root}: shard {root / split / name} is missing; run pack again")
        return cls(root, split, entry["records"], list(entry["shards"]), entry.get("meta", {}))

    def __len__(self) -> int:
        return self.records

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_source"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._source = None

    def _reader(self):
        if self._source is None:
            from grain.sources import ArrayRecordDataSource

            paths = [str(self.root / self.split / name) for name in self.shards]
            try:
                self._source = ArrayRecordDataSource(paths)
            except Exception as err:  # noqa: BLE001 - ArrayRecord's own errors do not name the file
                raise ValueError(f"packed data {self.root}, split {self.split!r}: a shard cannot be opened ({err}); "
                                 "pack the data again") from None
            if len(self._source) != self.records:
                raise ValueError(f"packed data {self.root}, split {self.split!r}: the shards hold "
                                 f"{len(self._source)} records, the manifest {self.records}; pack the data again")
        return self._source

    def decoded(self, index: int) -> dict[str, np.ndarray]:
        where = f"{index} of {self.root / self.split}"
        try:
            blob = self._reader()[index]
        except ValueError:
            raise
        except Exception as err:  # noqa: BLE001 - a damaged shard's read error, named
            raise ValueError(f"packed record {where} cannot be read ({err}); pack the data again") from None
        return decode_record(blob, where)
