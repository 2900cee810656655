"""Merch's predict inputs: each image, paired with its planogram `<stem>.json` where one lies beside it."""

from __future__ import annotations

from pathlib import Path


def planogram_units(root: Path, files: list[Path]) -> list:
    """One unit per image under `root`: (image, planogram) where `<stem>.json` is beside it, else (image,)."""
    from triskele.eval.engine import Unit, file_units

    return [Unit(u.key, (u.paths[0], u.paths[0].with_suffix(".json")), u.stem)
            if u.paths[0].with_suffix(".json").is_file() else u for u in file_units(root, files)]
