"""The config schema: one typed dataclass per section, and `Config`, which holds them.

A leaf: it imports no domain. A domain's options are filled in when a config is made for it
(`triskele.train.config.overrides.make_config`, `...migrations.config_from_dict`)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from triskele.train.bookkeeping.files import write_atomically
from triskele.train.config.yaml_format import YamlDumper

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


@dataclasses.dataclass
class Config:
    domain: str = "mars"
    options: Any = None
    """The domain's own keys (an instance of its spec's options dataclass), written as
    `<domain>.<key>` (`--set deepfake.holdout=...` sets `config.options.holdout` on a deepfake run).
    None until a config is made for a domain: `make_config` and `config_from_dict` fill it."""
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


def config_values(config: Config) -> dict[str, Any]:
    """Every key of `config` by its dotted name (`mars.scale`, `model.image_size`)."""
    return flat_keys(config.to_dict())


def flat_keys(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested mapping's leaves by dotted key."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping):
            flat.update(flat_keys(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat
