"""One typed config per run: a named preset plus overrides (`--set key=value`, YAML/JSON files)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import types
import typing
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from triskele.train.bookkeeping.files import write_atomically
from triskele.train.metrics import ALWAYS as METRICS_OF_EVERY_DOMAIN

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
    """Images per record: 1, single images; T > 1, clips of T frames (the input shape a model, its
    export and its predictor share; a domain whose spec has no `clips` refuses T > 1 before
    anything compiles). deepfake: 1 trains the frame detector, T > 1 the video detector."""
    init_from: str | None = None
    """A pretrained ViT file (timm or Hugging Face safetensors, a save_pretrained folder, a ViT or
    big_vision .npz) whose weights start the backbone of a fresh run."""
    norm_eps: float | None = None
    """LayerNorm epsilon; None: the init file's own (Hugging Face configs state 1e-12), else 1e-6."""
    quantization: str | None = None
    """Set by `python -m triskele.eval quantize` in the copy it writes: int8, fp8 or fp4 block kernels
    (inference only)."""
    class_names: list[str] | None = None
    """The model's output classes: read from the training data when the run starts and saved with it,
    so that evaluation, prediction and export never need the training data."""


@dataclasses.dataclass
class DataConfig:
    global_batch: int = 32
    path: str | None = None
    """On-disk dataset root; None trains on the domain's synthetic data."""
    train_size: int = 4096
    """Records in the synthetic training split."""
    eval_size: int = 512
    """Records in the synthetic evaluation split."""
    eval_split: str = "val"
    """The split training's periodic evaluation and `checkpoint.best_metric` read: val (held out of
    the training data); test is read only by `python -m triskele.eval --split test`."""
    val_fraction: float = 0.1
    """On-disk data without a val/ split of its own: the share of training records (files, or whole
    videos) held out as val, chosen by a hash of each record's path or video id."""
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
class InputLimits:
    """What one input may cost, checked from its header before anything is decoded: an input over a
    limit is refused with the reason and the key that raises it (predict lists it in errors.csv;
    training applies `data.bad_records`). Every reader of every domain checks these (training,
    evaluation, predict and prepare); predict and prepare take them as `--set limits.<key>=N`."""

    image_pixels: int = 25_000_000
    """Pixels (width x height) of an image file: a 24-megapixel photo (6000 x 4000) passes. PIL's
    `Image.MAX_IMAGE_PIXELS` is set to it. Predict's memory per input follows the pixels allowed."""
    frame_pixels: int = 4096 * 2160
    """Pixels of a video's frame (from the video's header): DCI 4K passes."""
    video_frames: int = 54_000
    """Frames decoded per video (from the header, and counted while decoding): 30 minutes at 30 fps."""
    planogram_facings: int = 1000
    """Facings (rows x columns) of a planogram: each is a crop the recogniser reads."""
    planogram_bytes: int = 1 << 20
    """Size of a planogram's JSON file (1 MiB), checked before it is read."""

    def over(self, key: str, amount: str) -> str:
        """Why an input is refused: '`amount`, over limits.KEY=LIMIT' and how to raise the limit."""
        return f"{amount}, over limits.{key}={getattr(self, key):,} (--set limits.{key}=N raises it)"

    def check(self, key: str, value: int, what: str) -> None:
        """ValueError '`what` VALUE UNITS, over limits.KEY=LIMIT ...' when `value` exceeds the limit."""
        if value > getattr(self, key):
            raise ValueError(f"{what} {self.over(key, f'{value:,} {_LIMIT_UNITS[key]}')}")


_LIMIT_UNITS = {"image_pixels": "pixels", "frame_pixels": "pixels", "video_frames": "frames",
                "planogram_facings": "facings", "planogram_bytes": "bytes"}


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
    gather_once: bool = True
    """With fsdp > 1: all-gather each stage's weights over fsdp once per step, before the schedule's
    loop, instead of in each of its repeats x microbatches + stages - 1 iterations (forward and
    backward). Faster; costs the stage's weights and gradients whole over fsdp for the step: set
    false when that does not fit (`python -m triskele.train.tools.plan` prices both)."""
    schedule: str = "circular"
    """circular: autodiff through the loop keeps every microbatch's activations until the backward
    (memory grows with microbatches). 1f1b: one forward and one backward per stage and iteration,
    each stage recomputed from its saved input, at most 2 x stages x repeats - 1 stage inputs kept
    (memory flat in microbatches; one more forward of the layers). Interleaved when repeats > 1,
    which needs microbatches a multiple of the stages."""


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


def _domain_options(domain: str) -> Any:
    from triskele.train.domains import get_domain

    return get_domain(domain).options()


@dataclasses.dataclass
class Config:
    domain: str = "mars"
    options: Any = dataclasses.field(default_factory=lambda: _domain_options("mars"))
    """The domain's own keys (its spec's options dataclass), read and written as `<domain>.<key>`:
    `config.deepfake.holdout` is `config.options.holdout` on a deepfake run."""
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
    limits: InputLimits = dataclasses.field(default_factory=InputLimits)

    def __getattr__(self, name: str) -> Any:
        if name == self.__dict__.get("domain"):
            return self.options
        raise AttributeError(f"{type(self).__name__!r} has no attribute {name!r}")

    def to_dict(self) -> dict[str, Any]:
        """Nested keys as `--set` spells them: the options under the domain's name."""
        data = dataclasses.asdict(self)
        return {"domain": data.pop("domain"), self.domain: data.pop("options"), **data}

    def save(self, path: str | Path) -> None:
        """Writes the config as JSON to `path` (atomically: a link planted there is replaced, not followed)."""
        write_atomically(Path(path), (json.dumps(self.to_dict(), indent=2) + "\n").encode())

    def to_yaml(self) -> str:
        """Every key as YAML (nested as `to_dict`) that `--config FILE` reads back to this config: a
        string that YAML 1.1 or 1.2 would read as something else (`20:25`, `off`, `1e-3`) is quoted,
        None is null, a float is written as its shortest exact repr."""
        header = (f"# triskele config, preset {self.preset}, every key resolved "
                  f"(python -m triskele.train --preset {self.preset} --print-config).\n"
                  "# Train it: python -m triskele.train --config FILE\n")
        return header + yaml.dump(self.to_dict(), Dumper=YamlDumper, sort_keys=False, default_flow_style=False,
                                  allow_unicode=True, width=1 << 30)


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


class _Presets(Mapping[str, dict[str, Any]]):
    """`<domain>-<size>` for every registered domain and size: the domain's spec's preset, then the
    size's; and `<domain>-<variant>-<size>` for each of its variants, the variant's values last."""

    def _all(self) -> dict[str, dict[str, Any]]:
        from triskele.train.domains import domains

        presets = {}
        for name, domain in domains().items():
            for variant, values_for in {"": lambda size: {}, **domain.variants}.items():
                for size, values in _SIZES.items():
                    presets[f"{name}-{variant + '-' if variant else ''}{size}"] = {
                        "domain": name, **domain.preset, **values, **values_for(size)}
        return presets

    def __getitem__(self, name: str) -> dict[str, Any]:
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


PRESETS: Mapping[str, dict[str, Any]] = _Presets()
DEFAULT_PRESET = "mars-tiny"


def config_values(config: Config) -> dict[str, Any]:
    """Every key of `config` by its dotted name (`mars.scale`, `model.image_size`)."""
    return _flat(config.to_dict())


def _flat(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def _cell(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value) if isinstance(value, float) else str(value)


def presets_table() -> str:
    """The README's preset table: a row per preset with what a run of it gets for every key some preset
    sets (blank: not a key of that preset's domain); keys every preset gives the same value follow the table."""
    rows = {name: _flat(make_config(name).to_dict()) for name in PRESETS}
    set_by_some = {key for name in PRESETS for key in _flat(PRESETS[name])}
    keys = list(dict.fromkeys(key for row in rows.values() for key in row if key in set_by_some))
    cells = {key: [_cell(rows[name][key]) if key in rows[name] else "" for name in PRESETS] for key in keys}
    shared = [key for key in keys if len(set(cells[key])) == 1]
    columns = [key for key in keys if key not in shared]
    lines = ["| preset | " + " | ".join(f"`{key}`" for key in columns) + " |",
             "|" + "---|" * (len(columns) + 1)]
    lines += [f"| `{name}` | " + " | ".join(cells[key][i] for key in columns) + " |" for i, name in enumerate(PRESETS)]
    if shared:
        lines += ["", "Every preset: " + ", ".join(f"`{key}={cells[key][0]}`" for key in shared) + "."]
    return "\n".join(lines) + "\n"


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


class YamlDumper(yaml.SafeDumper):
    """Writes YAML that YamlLoader and plain YAML 1.1 loaders both read back as written: a string
    either would resolve to another type is quoted (`'20:25'`, `'off'`, `'null'`, `'2024-01-01'`)."""


YamlDumper.yaml_implicit_resolvers = {
    first: [*yaml.SafeDumper.yaml_implicit_resolvers.get(first, []), *YamlLoader.yaml_implicit_resolvers.get(first, [])]
    for first in {*yaml.SafeDumper.yaml_implicit_resolvers, *YamlLoader.yaml_implicit_resolvers}
}
# Other readers: YAML 1.2's core schema reads `1e-3` as a float and `0o17` as an int, YAML 1.1's spec `y` as a bool.
YamlDumper.add_implicit_resolver("tag:yaml.org,2002:float",
                                 re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?$"),
                                 list("-+0123456789."))
YamlDumper.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^0o[0-7]+$"), ["0"])
YamlDumper.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:y|Y|n|N)$"), list("yYnN"))
YamlDumper.add_representer(  # a list (class names) on one line
    list, lambda dumper, data: dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=True))


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
    elif typing.get_origin(annotation) is list:
        if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            return list(value)
    elif annotation is str:
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
    expected = getattr(annotation, "__name__", str(annotation))
    raise ValueError(f"config key {key!r} must be {expected}, got {value!r} ({type(value).__name__})")


def _moved_to(key: str) -> str | None:
    """`data.holdout` -> `deepfake.holdout`: where a key that moved into a domain's options lives now."""
    from triskele.train.domains import domains

    section, _, field = key.partition(".")
    if section != "data":
        return None
    for name, domain in domains().items():
        if field in {f.name for f in dataclasses.fields(domain.options)}:
            return f"{name}.{field}"
    return None


def _apply_domain_option(config: Config, key: str, value: Any) -> bool:
    """Applies `<domain>.<option>`; False when `key` names no registered domain."""
    from triskele.train.domains import domains

    head, _, rest = key.partition(".")
    if head not in domains():
        return False
    if head != config.domain:
        raise ValueError(f"config key {key!r} is an option of the {head} domain, but this run's domain is "
                         f"{config.domain}; use a {head} preset or set {config.domain}.<option>")
    if rest:
        _apply(config.options, rest, value, head + ".")
    else:
        _apply_section(config.options, head, value)
    return True


def _apply_section(section: Any, full: str, value: Any) -> None:
    if not isinstance(value, Mapping):
        raise ValueError(f"config key {full!r} is a section; set its fields, e.g. {full}.<field>=...")
    for sub_key, sub_value in value.items():
        _apply(section, str(sub_key), sub_value, full + ".")


def _apply(config: Any, key: str, value: Any, prefix: str = "") -> None:
    if isinstance(config, Config) and _apply_domain_option(config, key, value):
        return
    head, _, rest = key.partition(".")
    types = _field_types(type(config))
    full = prefix + head
    if head not in types or full == "options":
        moved = _moved_to(full)
        if moved:
            raise ValueError(f"config key {full!r} moved to {moved!r}; set {moved}=...")
        known = ", ".join(prefix + name for name in types if prefix + name != "options")
        raise ValueError(f"unknown config key {full!r}; known keys here: {known}")
    current = getattr(config, head)
    if dataclasses.is_dataclass(current):
        if not rest:
            _apply_section(current, full, value)
            return
        _apply(current, rest, value, full + ".")
        return
    if rest:
        raise ValueError(f"config key {full!r} is a value, not a section: {full}.{rest} does not exist; "
                         f"set {full}=VALUE")
    value = _LEGACY_VALUES.get(full, {}).get(value, value) if isinstance(value, bool) else value
    setattr(config, head, _coerce(full, value, types[head]))
    if isinstance(config, Config) and head == "domain":
        _check_choice("domain", config.domain, _domain_names())
        if not isinstance(config.options, type(_domain_options(config.domain))):
            config.options = _domain_options(config.domain)


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
        raise ValueError(f"config file {str(path)!r} does not exist; --config takes a YAML or JSON file of "
                         "overrides (nested or dotted keys)")
    text = path.read_text()
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.load(text, Loader=YamlLoader)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise ValueError(f"config file {str(path)!r} is not valid {path.suffix[1:] or 'YAML'}: {err}") from None
    if not isinstance(data, Mapping):
        raise ValueError(f"config file {str(path)!r} holds a {type(data).__name__}, not a mapping of keys to values; "
                         "write e.g. `optim: {lr: 0.0003}` or `optim.lr: 0.0003`")
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


def _migrate(data: Mapping[str, Any]) -> dict[str, Any]:
    """A config saved before the domain options left `data`: its `data.<option>` keys under the
    domain's name (other domains' options, saved at their defaults, are dropped)."""
    data = dict(data)
    section = dict(data.get("data") or {})
    domain = data.get("domain", Config.domain)
    for field in list(section):
        moved = _moved_to(f"data.{field}")
        if moved is None:
            continue
        value = section.pop(field)
        owner, _, name = moved.partition(".")
        if owner == domain or field in {f.name for f in dataclasses.fields(_domain_options(domain))}:
            data.setdefault(domain, {})
            data[domain] = {**data[domain], name: value}
    if "data" in data:
        data["data"] = section
    return data


def _with_legacy_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """A saved config's domain options that it lacks, as the domain's `legacy_defaults` give them
    (its options resolved when a run starts: a saved config saved them, unless saved before them)."""
    from triskele.train.domains import domains

    name = data.get("domain", Config.domain)
    domain = domains().get(name) if isinstance(name, str) else None
    saved = data.get(name, {})
    if domain is not None and domain.legacy_defaults and isinstance(saved, Mapping):
        data[name] = {**domain.legacy_defaults, **saved}
    return data


def config_from_dict(data: Mapping[str, Any]) -> Config:
    """Rebuilds a saved config (config.json, or the copy inside a checkpoint), from before the domain
    options moved out of `data` too."""
    data = _with_legacy_defaults(_migrate(data))
    config = Config()
    if "domain" in data:
        _apply(config, "domain", data["domain"])
    for key, value in data.items():
        _apply(config, str(key), value)
    _check_choices(config)
    return config


def _check_choice(key: str, value: Any, choices: Iterable[str]) -> None:
    if value not in choices:
        raise ValueError(f"config key {key!r} is {value!r}; choose one of {', '.join(choices)}")


def _domain_names() -> list[str]:
    from triskele.train.domains import domains

    return list(domains())


def check_best_metric(domain: str, name: str) -> None:
    from triskele.train.domains import get_domain

    known = (*METRICS_OF_EVERY_DOMAIN, *get_domain(domain).metric_names)
    if name not in known:
        raise ValueError(f"checkpoint.best_metric={name!r} is not a {domain} metric; choose one of {', '.join(known)}")


def _check_choices(config: Config) -> None:
    from triskele.mesh.schedule import SCHEDULES
    from triskele.models.quantize import FORMATS as QUANTIZATION_FORMATS
    from triskele.models.vit import REMAT_POLICIES
    from triskele.train.bookkeeping.profiling import parse_profile_steps

    _check_choice("domain", config.domain, _domain_names())
    _check_choice("precision", config.precision, PRECISIONS)
    _check_choice("model.remat", config.model.remat, REMAT_POLICIES)
    _check_choice("pipeline.schedule", config.pipeline.schedule, SCHEDULES)
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
    _check_positive(positive)
    _check_limits(config.limits)


def _check_positive(values: Mapping[str, int]) -> None:
    for key, value in values.items():
        if value < 1:
            raise ValueError(f"config key {key!r} is {value}; it must be at least 1")


def _check_limits(limits: InputLimits) -> None:
    _check_positive({f"limits.{field.name}": getattr(limits, field.name) for field in dataclasses.fields(limits)})


def add_limits_flag(parser: argparse.ArgumentParser, keys: Iterable[str] | None = None,
                    defaults: Mapping[str, int] | None = None) -> None:
    """`--set limits.KEY=N` (repeatable) for a command that reads inputs outside a run (predict,
    prepare, serve), its help listing `keys` (default: all) with the command's `defaults` where it
    has its own; `input_limits(args.set, defaults)` reads it."""
    fields = {f.name: f.default for f in dataclasses.fields(InputLimits)} | dict(defaults or {})
    listed = ", ".join(f"limits.{key} (default {fields[key]:,})" for key in (keys or fields))
    parser.add_argument("--set", action="append", default=[], metavar="limits.KEY=N",
                        help=f"an input limit, checked from each input's header before decoding: {listed}")


def input_limits(overrides: Iterable[str] = (), defaults: Mapping[str, int] | None = None) -> InputLimits:
    """The input limits (a command's own `defaults` over InputLimits') with `limits.KEY=VALUE`
    overrides (predict's, prepare's and serve's `--set`), checked as a run's config is; a key
    outside `limits.` is refused."""
    limits = InputLimits(**(defaults or {}))
    for key, value in map(parse_override, overrides):
        section, _, field = key.partition(".")
        if section != "limits" or not field:
            raise ValueError(f"--set {key}=...: only the input limits are set here (limits.<key>: "
                             f"{', '.join(f'limits.{f.name}' for f in dataclasses.fields(InputLimits))})")
        _apply(limits, field, value, "limits.")
    _check_limits(limits)
    return limits
