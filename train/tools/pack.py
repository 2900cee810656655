"""`python -m triskele.train pack --preset P --data DIR --output PACKED`: every split the domain reads
from the tree DIR, decoded once into ArrayRecord shards (`triskele.train.data.packed`).

The records are what training reads before augmentation, shaped by the preset's keys and the
overrides given (`--set mars.scale=0.5`); the manifest records those keys, so a run with other
values is refused, naming them. Packing resumes: each shard is written whole under a temporary name
and renamed, the manifest updated after it, so a rerun after an interruption packs only the shards
not written yet; a PACKED made from another tree or with other shaping values is refused.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import multiprocessing
import sys
import time
from multiprocessing.pool import ThreadPool
from pathlib import Path
from typing import Any

from tqdm import tqdm
from triskele.train.bookkeeping.files import remove_partials, write_atomically
from triskele.train.commands import Command, bounded, folder
from triskele.train.config.overrides import make_config
from triskele.train.config.presets import DEFAULT_PRESET, PRESETS
from triskele.train.data.packed import (
    FORMAT,
    MANIFEST,
    encode_record,
    file_digest,
    read_manifest,
    shaping,
    shaping_differences,
    shard_name,
    write_shard,
)

SPLITS = ("train", "val", "test")
SHARD_RECORDS = 256
"""Records per shard unless `--shard-records` says otherwise."""

_WORKER: dict[str, Any] = {}


def _start_worker(source: Any, codecs: dict[str, str]) -> None:
    _WORKER.update(source=source, codecs=codecs)


def _encoded(index: int) -> bytes:
    return encode_record(_WORKER["source"].decoded(index), _WORKER["codecs"])


def _manifest(output: Path, domain: str, source: str, wanted: dict[str, Any], class_names: list[str]
              ) -> dict[str, Any]:
    """OUTPUT's manifest to go on with, or a new one; refuses one made from another tree, for another
    domain or with other shaping values."""
    if not (output / MANIFEST).is_file():
        if output.is_dir() and any(output.iterdir()):
            raise ValueError(f"--output {output} is a folder with files but no {MANIFEST}: give a new or empty folder")
        return {"format": FORMAT, "domain": domain, "source": source, "shaping": wanted, "class_names": class_names,
                "splits": {}}
    manifest = read_manifest(output)
    if manifest["domain"] != domain or manifest["source"] != source:
        raise ValueError(f"--output {output} holds a pack of {manifest['domain']} data from {manifest['source']}, not "
                         f"of {domain} data from {source}: give another --output")
    differ = shaping_differences(manifest["shaping"], wanted)
    if differ:
        raise ValueError(f"--output {output} was packed with other values of the keys that shape its records: "
                         f"{'; '.join(differ)}; give another --output, or the same values")
    return manifest


def _save(output: Path, manifest: dict[str, Any]) -> None:
    digests = [d for s in SPLITS for _, d in sorted(manifest["splits"].get(s, {}).get("digests", {}).items())]
    manifest["hash"] = hashlib.sha256("".join(digests).encode()).hexdigest()
    write_atomically(output / MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode())


def pack_data(config: Any, output: str | Path, shard_records: int = SHARD_RECORDS, workers: int = 0,
              progress: bool = True, threads: int = 4, codecs: dict[str, str] | None = None) -> dict[str, Any]:
    """Packs every split of `config`'s domain that `config.data.path` holds into `output`, decoding in
    `threads` threads (the decoders release the GIL), or in `workers` processes; returns the summary
    (per split: records, shards written now and before; splits the tree does not hold, why).
    `codecs` replace the domain's `pack_codecs` for the arrays they name (to measure the choices)."""
    from triskele.train.domains import resolve_from_data

    output, tree = Path(output), Path(config.data.path).resolve()
    if output.resolve() == tree or tree in output.resolve().parents:
        raise ValueError(f"--output {output} lies inside --data {tree}: give a folder outside the tree")
    domain = resolve_from_data(config)
    if not domain.pack_keys:
        raise ValueError(f"{domain.name} data is not packed (its domain declares no pack_keys)")
    manifest = _manifest(output, domain.name, str(tree), shaping(config, domain.pack_keys),
                         list(config.model.class_names or []))
    summary: dict[str, Any] = {"output": str(output), "splits": {}, "not_packed": {}}
    started = time.perf_counter()
    for split in SPLITS:
        try:
            source = domain.open_split(config, split)
            source = getattr(source, "packed_source", source)  # a split made from another (self-blended twins)
        except ValueError as err:  # a tree without this split (no test labels, say): said, not packed
            summary["not_packed"][split] = str(err)
            continue
        if not hasattr(source, "decoded"):
            raise ValueError(f"{domain.name} {split} records of this kind ({type(source).__name__}) are not packed; "
                             "train on the tree itself")
        entry = manifest["splits"].setdefault(split, {"records": len(source), "shards": [], "digests": {},
                                                      "complete": False})
        if entry["records"] != len(source):
            raise ValueError(f"{tree}'s {split} split has {len(source)} records, {entry['records']} when {output} "
                             "began to be packed: the tree changed; give another --output")
        (output / split).mkdir(parents=True, exist_ok=True)
        remove_partials(output / split)
        summary["splits"][split] = _pack_split(source, manifest, output, split, shard_records, workers, threads,
                                               {**domain.pack_codecs, **(codecs or {})}, progress)
        entry["meta"] = source.packed_meta()
        entry["complete"] = True
        _save(output, manifest)
    summary["seconds"] = round(time.perf_counter() - started, 3)
    summary["hash"] = manifest.get("hash")
    return summary


def _pack_split(source: Any, manifest: dict[str, Any], output: Path, split: str, shard_records: int, workers: int,
                threads: int, codecs: dict[str, str], progress: bool) -> dict[str, int]:
    """`split`'s shards not written yet, the manifest saved after each (what a rerun goes on from)."""
    entry, records = manifest["splits"][split], len(source)
    shards = max(1, math.ceil(records / shard_records))
    todo = [k for k in range(shards) if not (shard_name(k) in entry["digests"] and (output / split / shard_name(k))
                                               .is_file())]
    bar = tqdm(total=len(todo), disable=not progress, unit="shard", desc=split, dynamic_ncols=True)
    pool = (multiprocessing.get_context("spawn").Pool(workers, _start_worker, (source, codecs))
            if workers > 0 else ThreadPool(max(threads, 1), _start_worker, (source, codecs)))
    try:
        for k in todo:
            indices = range(k * shard_records, min(records, (k + 1) * shard_records))
            blobs = list(pool.imap(_encoded, indices, chunksize=4))
            path = output / split / shard_name(k)
            write_shard(path, blobs)
            entry["digests"][shard_name(k)] = file_digest(path)
            entry["shards"] = sorted(entry["digests"])
            _save(output, manifest)
            bar.update(1)
    finally:
        bar.close()
        pool.terminate()
    return {"records": records, "shards": shards, "written": len(todo), "kept": shards - len(todo)}


def _pack_command(parser: argparse.ArgumentParser):
    parser.add_argument("--preset", default=DEFAULT_PRESET, choices=sorted(PRESETS), metavar="NAME",
                        help=f"the preset whose keys shape the records (default {DEFAULT_PRESET})")
    parser.add_argument("--data", required=True, help="the tree to pack (a folder in a layout the domain reads)")
    parser.add_argument("--output", required=True, type=folder, help="the packed folder to write (new, or one to "
                        "finish packing)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                        help="override a config key that shapes the records (the manifest records each)")
    parser.add_argument("--shard-records", type=bounded(int, 1), default=SHARD_RECORDS,
                        help=f"records per shard (default {SHARD_RECORDS})")
    parser.add_argument("--threads", type=bounded(int, 1), default=4,
                        help="threads decoding records in this process (default 4)")
    parser.add_argument("--workers", type=bounded(int, 0), default=0,
                        help="processes decoding records instead of threads (default 0: threads)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")

    def run(args: argparse.Namespace) -> int:
        config = make_config(args.preset, [*args.overrides, f"data.path={args.data}"])
        summary = pack_data(config, args.output, args.shard_records, args.workers, not args.no_progress,
                            args.threads)
        print(json.dumps(summary, indent=2))
        for split, why in summary["not_packed"].items():
            print(f"{split}: not packed: {why}", file=sys.stderr)
        return 0

    return run


PACK = Command("Pack a dataset tree into ArrayRecord shards of records decoded once (what training reads "
               "before augmentation).", _pack_command)
