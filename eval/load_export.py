"""Serving an exported model: `load_exported(FILE)` runs what `python -m triskele.eval export`
wrote, with numpy input, without the model's code or its checkpoint (this module imports neither).

FILE holds the serialized `jax.export` program (StableHLO, weights included); FILE.json beside it
says what it is: domain, input shape, channels, class names, how pixels are expected, the
platforms it was lowered for, a SHA-256 of FILE, and `digest`, a SHA-256 of its own content
(`canonical_json`), so that a change to either file is found when it is loaded (what FILE.files/
holds is not covered). FILE.files/ beside
them, where FILE.json names it (`run_files`), holds what predict reads from a run's folder besides
the model (a gallery index), laid out as in the run's folder.

The hashes find damage (a truncated copy, a flipped bit, a hand edit), not tampering: whoever can
write the files can recompute them. A loaded sidecar is also checked against the program itself
(input shape and dtype, outputs, platforms), its fields' types and ranges are validated, and the
program is compiled once for its batch while loading, so that a model that cannot run here is a
ValueError naming FILE, before any input is read.
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from triskele.mesh.chunks import run_in_batches

EXPORT_FORMAT = "triskele-export"
DYNAMIC_BATCH = 64
"""The batch a `--batch dynamic` export runs in when none is asked for."""
EXPORT_VERSION = 3
"""2: the domain's options (e.g. deepfake frames_per_video) under `options`; 3: `digest`, the
sidecar's content hashed (the content records FILE's SHA-256, so the digest covers both files)."""
UNHASHED_VERSION = 2
"""Exports written before the sidecar was hashed: still loaded (FILE's SHA-256 is checked, the
sidecar validated against the program), with a warning that edits to the sidecar go unnoticed."""
SIDECAR_LIMIT = 16 * 2**20
"""The largest sidecar read, in bytes (a 100,000-class model's names take about 2 MB)."""
OPTION_TEXT_LIMIT = 1000
"""The longest string a domain option may hold."""


def sidecar_path(path: str | Path) -> Path:
    return Path(f"{path}.json")


def run_files_path(path: str | Path) -> Path:
    return Path(f"{path}.files")


def export_identity(meta: dict[str, Any]) -> dict[str, Any]:
    """An export's SHA-256 (checked against the file when loaded) and the step it was exported from."""
    return {"export_sha256": meta["sha256"], "step": meta.get("step")}


def canonical_json(meta: dict[str, Any]) -> bytes:
    """The bytes `digest` is the SHA-256 of: the sidecar without `digest`, keys sorted, no spaces,
    ASCII only (the same bytes however the file is indented, so anyone can recompute it)."""
    content = {key: value for key, value in meta.items() if key != "digest"}
    return json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def sidecar_digest(meta: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(meta)).hexdigest()


def record_shape(image_size: int, channels: int, frames: int) -> list[int]:
    """One input record's shape: (frames, size, size, channels) for a clip, else (size, size, channels)."""
    return [frames, image_size, image_size, channels] if frames > 1 else [image_size, image_size, channels]


def program_signature(exported: Any) -> dict[str, Any]:
    """What a `jax.export.Exported` itself takes and gives, as its sidecar records it (a symbolic
    dimension is None): `input_shape`, `input_dtype`, `outputs` ({name: shape, dtype}), `platforms`."""
    import jax

    def dims(shape: tuple) -> list[int | None]:
        return [d if isinstance(d, int) else None for d in shape]

    structure = jax.tree.unflatten(exported.out_tree, exported.out_avals)
    if len(exported.in_avals) != 1 or not isinstance(structure, dict):
        raise ValueError(f"the program takes {len(exported.in_avals)} arguments and returns {type(structure).__name__}"
                         "; a triskele export takes one array and returns a dict")
    (aval,) = exported.in_avals
    return {"input_shape": dims(aval.shape), "input_dtype": str(aval.dtype),
            "outputs": {name: {"shape": dims(value.shape), "dtype": str(value.dtype)}
                        for name, value in structure.items()},
            "platforms": list(exported.platforms)}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _option(value: Any) -> bool:
    """A domain option's value: a number, a flag, null or a short text (no nesting)."""
    return value is None or isinstance(value, (bool, int, float)) or (isinstance(value, str)
                                                                      and len(value) <= OPTION_TEXT_LIMIT)


_FIELDS: dict[str, tuple[Any, str]] = {
    **{key: (lambda v: _is_int(v) and v >= 1, "a positive integer") for key in ("image_size", "channels", "frames")},
    **{key: (lambda v: isinstance(v, str), "a string") for key in ("domain", "normalisation", "jax", "source")},
    "class_names": (lambda v: isinstance(v, list) and all(isinstance(n, str) for n in v), "a list of strings"),
    "step": (lambda v: v is None or (_is_int(v) and v >= 0), "null or an integer >= 0"),
    "sha256": (lambda v: isinstance(v, str) and len(v) == 64 and set(v) <= set("0123456789abcdef"), "64 hex digits"),
    "options": (lambda v: isinstance(v, dict) and all(_option(o) for o in v.values()),
                f"an object of numbers, booleans, nulls and strings of at most {OPTION_TEXT_LIMIT} characters"),
    "run_files": (lambda v: v is None or (isinstance(v, str) and v not in ("", ".", "..") and Path(v).name == v),
                  "absent or a folder's name (beside the file, no path)"),
}
"""The sidecar's fields beside those the program itself is compared with (`program_signature`):
(valid, what a valid value is)."""


def _field_errors(meta: dict[str, Any]) -> list[str]:
    """What is wrong with the sidecar's fields, each as 'KEY is VALUE; it must be ...'."""
    return [f"{key!r} is {str(meta.get(key))[:80]}; it must be {want}"
            for key, (valid, want) in _FIELDS.items() if not valid(meta.get(key))]


def _finite(text: str) -> float:
    """A JSON number as a float, refused when it is not finite (NaN, Infinity, 1e400): every number
    the sidecar holds is then one that `canonical_json` can write."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is not a finite number")
    return value


def _read_sidecar(sidecar: Path) -> dict[str, Any]:
    size = sidecar.stat().st_size
    if size > SIDECAR_LIMIT:
        raise ValueError(f"{sidecar} holds {size} bytes; an export's sidecar is at most {SIDECAR_LIMIT}: export the "
                         "model again")
    try:
        meta = json.loads(sidecar.read_bytes(), parse_float=_finite, parse_constant=_finite)
    except (ValueError, RecursionError) as err:  # not JSON, not UTF-8, or nested beyond the parser's depth
        raise ValueError(f"{sidecar} is not valid JSON ({str(err)[:200]}); export the model again") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{sidecar} holds a JSON {type(meta).__name__}, not an export's description; export the "
                         "model again")
    return meta


def _export_command(path: Path, meta: dict[str, Any]) -> str:
    """The way out of most errors: exporting again, from the run the sidecar names where it names one."""
    source = meta.get("source")
    run = source if isinstance(source, str) and 0 < len(source) <= 1000 else "RUN"
    return f"python -m triskele.eval export --workdir {run} --output {path}"


def _again(path: Path, meta: dict[str, Any]) -> str:
    return f"export it again ({_export_command(path, meta)})"


def _verified(path: Path, sidecar: Path) -> tuple[dict[str, Any], bytes]:
    """The sidecar's content and the serialized model, each checked against the hashes (the sidecar's
    digest first: it vouches for the model's SHA-256) and the sidecar's fields validated."""
    meta = _read_sidecar(sidecar)
    again = _again(path, meta)
    version = meta.get("version")
    if meta.get("format") != EXPORT_FORMAT or version not in (UNHASHED_VERSION, EXPORT_VERSION):
        raise ValueError(f"{sidecar} describes format {meta.get('format')!r} version {version!r}; "
                         f"this triskele reads {EXPORT_FORMAT!r} version {EXPORT_VERSION} (and "
                         f"{UNHASHED_VERSION}): export the model again")
    if version == EXPORT_VERSION and meta.get("digest") != sidecar_digest(meta):
        raise ValueError(f"{sidecar} is corrupted: its content does not match the digest it records (the sidecar "
                         f"changed since {path.name} was exported); {again}")
    if version == UNHASHED_VERSION:
        warnings.warn(f"{sidecar} was written before sidecars were hashed (version {UNHASHED_VERSION}): a change "
                      f"to it would go unnoticed; {again}", stacklevel=4)
    if errors := _field_errors(meta):
        raise ValueError(f"{sidecar}: " + "; ".join(errors) + f"; {again}")
    payload = path.read_bytes()
    if hashlib.sha256(payload).hexdigest() != meta["sha256"]:
        raise ValueError(f"exported model {path} is corrupted: its SHA-256 does not match {sidecar.name} "
                         f"(the serialized model changed since it was exported); {again}")
    return meta, payload


class ExportedModel:
    """`model(images) -> {output name: array}` for images shaped as `meta['input_shape']` says (any
    number of them, in batches of the exported size); `dispatch`/`fetch` for the streaming engine.
    Every check of the files, and the program's compilation for `batch`, happens here: a model
    that loads runs."""

    def __init__(self, path: str | Path, batch: int | None = None):
        import jax

        self.path = Path(path)
        sidecar = sidecar_path(self.path)
        if not self.path.is_file() or not sidecar.is_file():
            raise ValueError(f"exported model {self.path} needs the file and {sidecar.name} beside it; export with "
                             "python -m triskele.eval export --workdir DIR --output FILE")
        meta, payload = _verified(self.path, sidecar)
        again = _again(self.path, meta)
        try:
            self.exported = jax.export.deserialize(bytearray(payload))
            signature = program_signature(self.exported)
        except Exception as err:  # a version of jax that cannot read it, or damage the hash did not catch
            raise ValueError(f"exported model {self.path} cannot be deserialized by jax {jax.__version__} "
                             f"(exported with jax {meta['jax']}): {str(err)[:300]}; export it again with this jax "
                             f"({_export_command(self.path, meta)})") from None
        claims = [(key, meta.get(key), value) for key, value in signature.items()]
        sizes = record_shape(meta["image_size"], meta["channels"], meta["frames"])
        claims.append(("the record shape of its image_size, channels and frames", sizes, signature["input_shape"][1:]))
        for key, claimed, actual in claims:
            if claimed != actual:
                raise ValueError(f"{sidecar} does not describe the program in {self.path.name}: {key} is {claimed} "
                                 f"there, {actual} in the program (what it was exported for); {again}")
        fixed = meta["input_shape"][0]
        if batch is not None and not (_is_int(batch) and batch >= 1):
            raise ValueError(f"batch {batch!r} must be a positive integer")
        if fixed is not None and batch not in (None, fixed):
            raise ValueError(f"exported model {self.path} was exported for batches of {fixed}; use --batch {fixed} "
                             "or export with --batch dynamic")
        if meta.get("run_files"):  # found beside FILE wherever FILE is now
            meta["run_files"] = str(self.path.parent / meta["run_files"])
        self.meta: dict[str, Any] = meta
        self.batch: int = fixed or batch or DYNAMIC_BATCH
        self._call = jax.jit(self.exported.call)
        self._compile(meta)

    def _compile(self, meta: dict[str, Any]) -> None:
        """The first call's compilation, done now (the engine's calls reuse it): a program this
        jax or this platform cannot run fails here, as a ValueError that says what would."""
        import jax

        spec = jax.ShapeDtypeStruct((self.batch, *meta["input_shape"][1:]), np.dtype(meta["input_dtype"]))
        try:
            self._call.lower(spec).compile()
        except Exception as err:
            here, platforms = jax.export.default_export_platform(), meta["platforms"]
            command = _export_command(self.path, meta)
            if here in platforms:
                why = (f"its program does not compile with jax {jax.__version__} (exported with jax {meta['jax']}: "
                       "damaged, or written by a jax this one cannot read)")
                way = f"export it again with this jax ({command})"
            else:
                why = f"it was exported for {' or '.join(platforms)}, this process runs on {here}"
                way = f"run it on {' or '.join(platforms)}, or export it again here ({command} --platforms {here})"
            raise ValueError(f"exported model {self.path} does not run here: {why}: {str(err)[:300].rstrip('.')}; "
                             f"{way}") from None

    @property
    def identity(self) -> dict[str, Any]:
        return export_identity(self.meta)

    def dispatch(self, images: np.ndarray) -> dict[str, Any]:
        images = np.asarray(images, np.float32)
        expected = self.meta["input_shape"][1:]
        if list(images.shape[1:]) != expected:
            shape = ", ".join(map(str, expected))
            raise ValueError(f"exported model {self.path} takes inputs of shape (batch, {shape}), got {images.shape}")
        return self._call(images)

    def fetch(self, handle: dict[str, Any]) -> dict[str, np.ndarray]:
        return {key: np.asarray(value) for key, value in handle.items()}

    def __call__(self, images: np.ndarray) -> dict[str, np.ndarray]:
        return run_in_batches(self.dispatch, self.fetch, images, self.batch)


def load_exported(path: str | Path, batch: int | None = None) -> ExportedModel:
    return ExportedModel(path, batch)
