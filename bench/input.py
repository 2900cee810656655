"""The training input path against what a GPU consumes: records/s per core of the trainer's own
input path (the same source, augmentation and batching, no model), beside the planner's predicted
records/s for the preset on one H100 and the cores per H100 that rate needs.

    python bench/input.py --preset mars-b16 [--data DIR] [--split train] [--workers N] [--seconds S]
                          [--records N] [--pack] [--json FILE]

Without `--data` it writes an on-disk tree at realistic sizes first (in --tree, default
runs/bench-input/<domain>): mars, 1024 x 1024 grey navigation-camera JPEGs with their label, rover
and range PNGs in the AI4Mars layout; deepfake, 256 x 256 face-crop PNG frames in the
FaceForensics++ frame layout as `prepare` writes them; merch, product-crop JPEGs of 200-600 pixels
a side in class folders. `--pack` also packs that tree (`python -m triskele.train pack`) and
measures the pack the same way, with the time packing took against one epoch of the tree.

Cores: the CPU seconds this process and its input workers spent (user + system, from /proc), over
the wall seconds measured; records/s per core is records over those CPU seconds. The H100 rate is
the planner's pick on one H100 (bfloat16) at the preset's global batch or 256, whichever is smaller.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
from common import machine, print_table, write_json
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of process `pid` (default this one) and every live descendant."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry.name)] = int(fields[1])
        times[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    root = pid or os.getpid()
    total, stack = 0.0, [root]
    while stack:
        current = stack.pop()
        total += times.get(current, 0.0)
        stack += [child for child, parent in parents.items() if parent == current]
    return total


def write_mars_tree(root: Path, frames: int) -> None:
    from triskele.train.domains.mars.data import render_terrain

    msl = root / "msl"
    for folder in ("images/edr", "images/mxy", "images/rng-30m", "labels/train"):
        (msl / folder).mkdir(parents=True, exist_ok=True)
    for k in range(frames):
        stem = f"NLA_{400000000 + k}EDR_F0000000NCAM00001M1"
        image, label = render_terrain(k, 1024)
        Image.fromarray((image * 255).astype(np.uint8)).save(msl / "images/edr" / f"{stem}.JPG", quality=92)
        Image.fromarray(label).save(msl / "labels/train" / f"{stem}.png")
        rover = np.zeros((1024, 1024), np.uint8)
        rover[900:] = 1
        far = (label == 255).astype(np.uint8)
        Image.fromarray(rover).save(msl / "images/mxy" / f"{stem.replace('EDR', 'MXY')}.png")
        Image.fromarray(far).save(msl / "images/rng-30m" / f"{stem.replace('EDR', 'RNG')}.png")


def write_deepfake_tree(root: Path, videos: int) -> None:
    from triskele.train.domains.deepfake.data import SyntheticFaces

    faces = SyntheticFaces("train", videos * 32, 256, 32, seed=0)
    for v in range(videos):
        kind = ("original_sequences/youtube" if v % 2 == 0 else "manipulated_sequences/Deepfakes")
        name = f"{v:03d}" if v % 2 == 0 else f"{v:03d}_{v - 1:03d}"
        folder = root / kind / "c23" / "frames" / name
        folder.mkdir(parents=True, exist_ok=True)
        for f in range(32):
            pixels = (faces.load(v * 32 + f)["image"] * 255).astype(np.uint8)
            Image.fromarray(pixels).save(folder / f"{f:06d}.png")


def write_merch_tree(root: Path, images: int) -> None:
    from triskele.train.domains.merch.data import draw_package, sku_design

    rng = np.random.default_rng(0)
    for k in range(images):
        sku = k % 50
        side = int(rng.integers(200, 600))
        picture = draw_package(sku_design(0, sku, 5)).resize((side, int(side * rng.uniform(1.0, 1.6))))
        folder = root / "train" / f"sku{sku:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        picture.convert("RGB").save(folder / f"{k:05d}.jpg", quality=90)


TREES = {"mars": write_mars_tree, "deepfake": write_deepfake_tree, "merch": write_merch_tree}
SIZES = {"mars": 64, "deepfake": 16, "merch": 1500}
"""Frames, videos (of 32 frames) and crops of the generated trees: enough for a few batches."""


def h100_records_per_s(preset: str, overrides: list[str]) -> float:
    """The planner's records/s for `preset` on one H100 in bfloat16 (its pick of mesh and remat)."""
    from triskele.mesh.perf.planner import candidates
    from triskele.train.config.overrides import make_config
    from triskele.train.tools.plan_inputs import plan_inputs

    batch = min(make_config(preset, overrides).data.global_batch, 256)
    config = make_config(preset, [*overrides, f"data.global_batch={batch}", "precision=bfloat16"])
    best = candidates(plan_inputs(config, "h100", 1, 1))[0]
    return float(best.row()["images_per_s"])


def measure(config, split: str, workers: int, seconds: float) -> dict[str, float]:
    """Records/s of the trainer's input path for `split` (train: its batches, global order and
    augmentation; another split: its evaluation batches) over about `seconds` after one warm batch."""
    from triskele.train.data.pipeline import eval_batches, train_batches
    from triskele.train.domains import resolve_from_data

    domain = resolve_from_data(config)
    source = domain.open_split(config, split)
    batch = config.data.global_batch
    if split == "train":
        batches = train_batches(source, batch, config.run.seed, 0, 1 << 30, (0, batch), config.data.threads,
                                config.data.prefetch, workers)
    else:
        batches = eval_batches(source, batch, (0, batch), config.data.threads, config.data.prefetch, workers)
    next(batches)
    cpu, began, records = cpu_seconds(), time.perf_counter(), 0
    while time.perf_counter() - began < seconds:
        try:
            records += len(next(batches)["valid"])
        except StopIteration:
            break
    wall, used = time.perf_counter() - began, cpu_seconds() - cpu
    return {"split_records": len(source), "records": records, "seconds": round(wall, 2), "cores": round(used / wall, 2),
            "records_per_s": round(records / wall, 1), "records_per_s_per_core": round(records / max(used, 1e-9), 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="mars-b16")
    parser.add_argument("--data", help="a tree or a packed folder (default: a realistic tree written first)")
    parser.add_argument("--tree", help="where the generated tree goes (default runs/bench-input/<domain>)")
    parser.add_argument("--split", default="train")
    parser.add_argument("--workers", type=int, default=0, help="input worker processes (default 0: threads)")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--records", type=int, help="size of the generated tree (default per domain)")
    parser.add_argument("--pack", action="store_true", help="also pack the tree and measure the pack")
    parser.add_argument("--codec", action="append", default=[], metavar="ARRAY=CODEC",
                        help="with --pack: store an array of the records with another codec (raw, zlib, png)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)

    from triskele.train.config.overrides import make_config

    domain = make_config(args.preset, args.set).domain
    data = Path(args.data) if args.data else Path(args.tree or ROOT / "runs" / "bench-input" / domain)
    if not args.data and not data.is_dir():
        print(f"writing a {domain} tree at realistic sizes in {data} ...", file=sys.stderr, flush=True)
        TREES[domain](data, args.records or SIZES[domain])
    overrides = ["data.global_batch=32", "data.val_fraction=0", *args.set]
    rows = [{"data": "folder", "path": str(data),
             **measure(make_config(args.preset, [*overrides, f"data.path={data}"]), args.split, args.workers,
                       args.seconds)}]
    if args.pack:
        from triskele.train.tools.pack import pack_data

        codecs = dict(codec.split("=", 1) for codec in args.codec)
        packed = data.with_name(data.name + "-packed" + "".join(f"-{k}-{v}" for k, v in codecs.items()))
        began = time.perf_counter()
        pack_data(make_config(args.preset, [*overrides, f"data.path={data}"]), packed, progress=False, codecs=codecs)
        pack_seconds = time.perf_counter() - began
        size = sum(f.stat().st_size for f in (packed / args.split).glob("*.array_record"))
        rows.append({"data": "packed " + (",".join(args.codec) or "default"), "path": str(packed),
                     "pack_seconds": round(pack_seconds, 1),
                     **measure(make_config(args.preset, [*overrides, f"data.path={packed}"]), args.split,
                               args.workers, args.seconds)})
        rows[-1]["mb_per_record"] = round(size / rows[-1]["split_records"] / 1e6, 3)
        rows[-1]["folder_epoch_seconds"] = round(rows[0]["split_records"] / rows[0]["records_per_s"], 1)
    rate = h100_records_per_s(args.preset, args.set)
    for row in rows:
        row["h100_records_per_s"] = round(rate, 1)
        row["cores_per_h100"] = round(rate / row["records_per_s_per_core"], 1)
    print(f"{args.preset}, split {args.split}, workers {args.workers}: the trainer's input path, no model")
    print_table(rows, [c for c in ("data", "records", "seconds", "cores", "records_per_s", "records_per_s_per_core",
                                   "h100_records_per_s", "cores_per_h100", "pack_seconds", "folder_epoch_seconds",
                                   "mb_per_record")
                       if any(c in row for row in rows)])
    write_json(args.json, {"preset": args.preset, "split": args.split, "workers": args.workers, "machine": machine(),
                           "rows": rows, **{k: rows[-1][k] for k in ("records_per_s_per_core", "h100_records_per_s",
                                                                     "cores_per_h100")}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
