"""One typed config per run: a named preset plus overrides (`--set key=value`, YAML/JSON files)."""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from triskele.models.quantize import FORMATS as QUANTIZATION_FORMATS
from triskele.models.vit import REMAT_POLICIES
from triskele.train.metrics import check_best_metric
from triskele.train.profiling import parse_profile_steps

DOMAINS = ("mars", "merch", "deepfake")
PRECISIONS = ("auto", "float32", "bfloat16", "fp8")


@dataclasses.dataclass
class ModelConfig:
    size: str = "tiny"
    patch: int = 8
    image_size: int = 64
    channels: int = 1
    pool: str = "cls"
    remat: str = "dots"
    """What each block keeps for its backward: none (recompute nothing), dots (keep matmul outputs,
    recompute the elementwise ops: the fastest measured on CPU), full (keep only the block input)."""
    attention: str = "auto"
    depth: int | None = None
    """Overrides the named size's depth when set."""
    frames: int = 1
    """deepfake: 1 trains the frame detector; T > 1 the video detector on clips of T frames."""
    init_from: str | None = None
    """A pretrained ViT file (timm or Hugging Face safetensors, a save_pretrained folder, a ViT or
    big_vision .npz) whose weights start the backbone of a fresh run."""
    norm_eps: float | None = None
    """LayerNorm epsilon; None: the init file's own (Hugging Face configs state 1e-12), else 1e-6."""
    quantization: str | None = None
    """Set by `python -m triskele.eval quantize` in the copy it writes: int8, fp8 or fp4 block kernels
    (inference only)."""


@dataclasses.dataclass
class DataConfig:
    global_batch: int = 32
    path: str | None = None
    """On-disk dataset root; None trains on the domain's synthetic data."""
    train_size: int = 4096
    """Records in the synthetic training split."""
    eval_size: int = 512
    """Records in the synthetic evaluation split."""
    eval_split: str = "test"
    label_agreement: int = 3
    """mars: AI4Mars test labels to read, masked-gold-min<k>-100agree, k in 1..3."""
    frames_per_video: int = 32
    """deepfake: frames sampled uniformly from each video."""
    holdout: str | None = None
    """deepfake: manipulation family/method left out of training (cross-manipulation protocol)."""
    eval_methods: str | None = None
    """deepfake: comma-separated methods whose fakes evaluation uses (None: all)."""
    compression: str = "c23"
    """deepfake: FaceForensics++ compression folder (raw, c23, c40)."""
    num_skus: int = 100
    """merch (synthetic): SKUs in the training catalogue."""
    threads: int = 4
    """Threads that load batches ahead of the step."""
    prefetch: int = 4
    """Batches loaded ahead of the step."""
    workers: int = 0
    """Worker processes (Grain multiprocessing); 0 loads in threads of this process."""
    bad_records: str = "error"
    """An unreadable image or mask: `error` stops naming the file; `skip` trains on the next good
    record instead, lists the file in WORKDIR/bad_records.txt and counts it (evaluation leaves it out)."""


@dataclasses.dataclass
class OptimConfig:
    lr: float = 1e-3
    warmup_steps: int = 50
    end_lr_fraction: float = 0.01
    weight_decay: float = 0.05
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    clip_norm: float = 1.0
    grad_accum: int = 1
    """Microbatches whose gradients are summed into one update."""


@dataclasses.dataclass
class CheckpointConfig:
    every: int = 200
    keep: int = 2
    best_metric: str = "eval_loss"
    best_mode: str = "min"


@dataclasses.dataclass
class PipelineConfig:
    """Used when the mesh has pipeline > 1 (repeats also shapes the stacked layers)."""

    microbatches: int = 4
    repeats: int = 1


@dataclasses.dataclass
class RunConfig:
    steps: int = 600
    log_every: int = 20
    eval_every: int = 200
    """Evaluate every N steps and at the end; 0 never evaluates."""
    seed: int = 0
    compilation_cache: str | None = None
    """Persistent compilation cache folder; None = ~/.cache/triskele/jax, 'off' disables it."""
    on_nonfinite: str = "stop"
    """A step whose loss or gradient is not finite: `stop` the run (naming the step), or `skip` it
    (parameters and optimizer state unchanged) and stop after run.max_skipped_steps in a row."""
    max_skipped_steps: int = 10
    profile_steps: str | None = None
    """FIRST:LAST, e.g. '20:25': a jax.profiler trace of those global steps in WORKDIR/profile/."""


@dataclasses.dataclass
class Config:
    domain: str = "mars"
    preset: str = "mars-tiny"
    mesh: str = ""
    """Mesh spec, e.g. 'data=2,fsdp=2,tensor=2'; '' puts every device on `data`."""
    dcn: str = ""
    """Multi-host: how many hosts each mesh axis spans, e.g. 'data=2' (hybrid mesh); '' = plain mesh."""
    precision: str = "auto"
    """Compute dtype: float32, bfloat16, fp8 (bfloat16 with the blocks' matmuls in FP8), or auto
    (bfloat16 on GPU/TPU, float32 on CPU). Weights stay float32."""
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    pipeline: PipelineConfig = dataclasses.field(default_factory=PipelineConfig)
    run: RunConfig = dataclasses.field(default_factory=RunConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")


# Per size: model fields and the run's scale. `tiny` trains on a 2-core CPU in minutes.
_SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"model.size": "tiny", "model.patch": 8, "model.image_size": 64, "optim.lr": 2e-3,
             "run.eval_every": 300},
    "s16": {"model.size": "S", "model.patch": 16, "model.image_size": 224, "data.global_batch": 256,
            "optim.lr": 5e-4, "optim.warmup_steps": 1000, "run.steps": 20000, "checkpoint.every": 1000,
            "run.eval_every": 1000, "data.train_size": 100_000, "data.eval_size": 5000},
    "b16": {"model.size": "B", "model.patch": 16, "model.image_size": 224, "data.global_batch": 512,
            "optim.lr": 3e-4, "optim.warmup_steps": 2000, "run.steps": 30000, "checkpoint.every": 1000,
            "run.eval_every": 1000, "data.train_size": 200_000, "data.eval_size": 5000, "model.remat": "full"},
    "l16": {"model.size": "L", "model.patch": 16, "model.image_size": 224, "data.global_batch": 1024,
            "optim.lr": 2e-4, "optim.warmup_steps": 3000, "run.steps": 50000, "checkpoint.every": 1000,
            "run.eval_every": 1000, "data.train_size": 400_000, "data.eval_size": 5000, "model.remat": "full"},
}
_DOMAINS: dict[str, dict[str, Any]] = {
    "mars": {"model.channels": 1, "checkpoint.best_metric": "eval_loss"},
    "merch": {"model.channels": 3, "data.train_size": 20000, "data.eval_size": 1200, "run.steps": 1200,
              "run.eval_every": 600},
    "deepfake": {"model.channels": 3, "data.frames_per_video": 8, "data.train_size": 6144,
                 "data.eval_size": 1024, "run.steps": 1500, "run.eval_every": 750},
}
PRESETS: dict[str, dict[str, Any]] = {
    f"{domain}-{size}": {"domain": domain, **_DOMAINS[domain], **_SIZES[size]}
    for domain in DOMAINS
    for size in _SIZES
}
DEFAULT_PRESET = "mars-tiny"


_LEGACY_VALUES: dict[str, dict[Any, Any]] = {"model.remat": {True: "full", False: "none"}}
"""Values older configs (and checkpoints) spell differently: model.remat was a bool."""


class YamlLoader(yaml.SafeLoader):
    """YAML's safe loader with YAML 1.2's plain scalars: YAML 1.1 reads `20:25` as the integer 1225
    and `off`, `no`, `on`, `yes` as booleans, which would turn `run.profile_steps=20:25` and
    `run.compilation_cache=off` into nonsense."""


_YAML_1_2_SCALARS = {
    "tag:yaml.org,2002:bool": r"^(?:true|True|TRUE|false|False|FALSE)$",
    "tag:yaml.org,2002:int": r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$",
    "tag:yaml.org,2002:float": r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9_]+(?:[eE][-+][0-9]+)?"
                               r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
}
YamlLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in _YAML_1_2_SCALARS]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
for _tag, _pattern in _YAML_1_2_SCALARS.items():
    YamlLoader.add_implicit_resolver(_tag, re.compile(_pattern), list("-+0123456789.tTfF"))


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _coerce(key: str, value: Any, annotation: Any) -> Any:
    """Checks `value` against the field's type, converting the few safe cases (int -> float)."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (annotation,) = [a for a in args if a is not type(None)]
    if annotation is bool:
        if isinstance(value, bool):
            return value
    elif annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif annotation is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads '3e-4' (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif annotation is str:
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
    expected = getattr(annotation, "__name__", str(annotation))
    raise ValueError(f"config key {key!r} must be {expected}, got {value!r} ({type(value).__name__})")


def _apply(config: Any, key: str, value: Any, prefix: str = "") -> None:
    head, _, rest = key.partition(".")
    types = _field_types(type(config))
    full = prefix + head
    if head not in types:
        known = ", ".join(prefix + name for name in types)
        raise ValueError(f"unknown config key {full!r}; known keys here: {known}")
    current = getattr(config, head)
    if dataclasses.is_dataclass(current):
        if not rest:
            if not isinstance(value, Mapping):
                raise ValueError(f"config key {full!r} is a section; set its fields, e.g. {full}.<field>=...")
            for sub_key, sub_value in value.items():
                _apply(current, str(sub_key), sub_value, full + ".")
            return
        _apply(current, rest, value, full + ".")
        return
    if rest:
        raise ValueError(f"config key {full!r} has no field {rest!r}")
    value = _LEGACY_VALUES.get(full, {}).get(value, value) if isinstance(value, bool) else value
    setattr(config, head, _coerce(full, value, types[head]))


def parse_override(text: str) -> tuple[str, Any]:
    """`optim.lr=3e-4` -> ("optim.lr", 0.0003); values are read as YAML scalars."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"override {text!r} is not KEY=VALUE; write e.g. optim.lr=3e-4")
    try:
        value = yaml.load(raw, Loader=YamlLoader) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw.strip()  # not a YAML scalar: the text itself (a string field may take it)
    return key.strip(), value


def load_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"config file {str(path)!r} does not exist")
    text = path.read_text()
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.load(text, Loader=YamlLoader)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise ValueError(f"config file {str(path)!r} is not valid {path.suffix[1:] or 'YAML'}: {err}") from None
    if not isinstance(data, Mapping):
        raise ValueError(f"config file {str(path)!r} must hold a mapping of keys to values")
    return dict(data)


def make_config(
    preset: str = DEFAULT_PRESET,
    overrides: Mapping[str, Any] | Iterable[str] | None = None,
    files: Iterable[str | Path] = (),
) -> Config:
    """A preset, then each file, then each override (later wins). Overrides: dict or KEY=VALUE strings."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; presets are {', '.join(PRESETS)}")
    config = Config(preset=preset)
    for key, value in PRESETS[preset].items():
        _apply(config, key, value)
    for path in files:
        for key, value in load_file(path).items():
            _apply(config, str(key), value)
    if overrides is None:
        overrides = {}
    items = overrides.items() if isinstance(overrides, Mapping) else map(parse_override, overrides)
    for key, value in items:
        _apply(config, key, value)
    _check_choices(config)
    return config


def config_from_dict(data: Mapping[str, Any]) -> Config:
    """Rebuilds a saved config (config.json, or the copy inside a checkpoint)."""
    config = Config()
    for key, value in data.items():
        _apply(config, str(key), value)
    _check_choices(config)
    return config


def _check_choice(key: str, value: Any, choices: Iterable[str]) -> None:
    if value not in choices:
        raise ValueError(f"config key {key!r} is {value!r}; choose one of {', '.join(choices)}")


def _check_choices(config: Config) -> None:
    _check_choice("domain", config.domain, DOMAINS)
    _check_choice("precision", config.precision, PRECISIONS)
    _check_choice("model.remat", config.model.remat, REMAT_POLICIES)
    _check_choice("data.bad_records", config.data.bad_records, ("error", "skip"))
    _check_choice("run.on_nonfinite", config.run.on_nonfinite, ("stop", "skip"))
    if config.run.profile_steps is not None:
        parse_profile_steps(config.run.profile_steps, config.run.steps)
    check_best_metric(config.domain, config.checkpoint.best_metric)
    if config.model.quantization is not None:
        _check_choice("model.quantization", config.model.quantization, QUANTIZATION_FORMATS)
    if config.checkpoint.best_mode not in ("min", "max"):
        raise ValueError(f"config key 'checkpoint.best_mode' is {config.checkpoint.best_mode!r}; use min or max")
    positive = {
        "data.global_batch": config.data.global_batch, "optim.grad_accum": config.optim.grad_accum,
        "checkpoint.every": config.checkpoint.every, "checkpoint.keep": config.checkpoint.keep,
        "run.steps": config.run.steps, "run.log_every": config.run.log_every,
        "pipeline.microbatches": config.pipeline.microbatches, "pipeline.repeats": config.pipeline.repeats,
        "data.train_size": config.data.train_size, "data.eval_size": config.data.eval_size,
        "run.max_skipped_steps": config.run.max_skipped_steps,
    }
    if config.run.eval_every < 0:
        raise ValueError(f"config key 'run.eval_every' is {config.run.eval_every}; use 0 (never) or more")
    for key, value in positive.items():
        if value < 1:
            raise ValueError(f"config key {key!r} is {value}; it must be at least 1")
