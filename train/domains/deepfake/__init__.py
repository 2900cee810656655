"""deepfake: real/fake detection of face crops, per frame and per video."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from triskele.train.commands import Flag, bounded, folder
from triskele.train.data.splits import check_split
from triskele.train.domains.deepfake.crops import OLD_RUNS
from triskele.train.domains.deepfake.detectors import FACE_DETECTORS
from triskele.train.domains.deepfake.prepare import PREPARE
from triskele.train.domains.deepfake.seek import SAMPLING
from triskele.train.domains.deepfake.video import DECODING
from triskele.train.domains.spec import Domain, Later

if TYPE_CHECKING:
    from flax import nnx
    from triskele.models.deepfake import FrameDetector, VideoDetector
    from triskele.train.data.pipeline import Source


@dataclasses.dataclass
class DeepfakeOptions:
    frames_per_video: int = 32
    """Frames sampled uniformly from each video."""
    fakes: str = "supervised"
    """How training sees fakes: `supervised` trains on the data's own fakes (synthetic families, or
    the methods on disk); `sbi` makes each real face's fake twin by self-blending and never reads a
    fake (README, "deepfake": which generalises where, measured)."""
    holdout: str | None = None
    """A manipulation family/method left out of training (cross-manipulation protocol); with
    `fakes=sbi`, the pool transforms that resemble the family are removed too."""
    eval_methods: str | None = None
    """Comma-separated methods whose fakes the test split holds (None: all); val, held out of the
    training data, holds the training methods (less `holdout`)."""
    compression: str = "c23"
    """FaceForensics++ compression folder (raw, c23, c40)."""
    sbi_mask: str = "auto"
    """With `fakes=sbi`, the face region the blend mask is made from: `auto` a crop's stored landmarks'
    convex hull where `prepare` stored them (the landmarks extra), else the ellipse inscribed in its
    face box, and a synthetic face's drawn oval; `ellipse` never the hull; `hull` always (a synthetic
    face's drawn landmarks; a crop without landmarks is an error)."""
    face_crops: str | None = None
    """How the faces the run trains on were cropped, which predict and serve then crop videos by:
    `aligned` on 5 landmarks (the landmarks extra) or `box` (the face box enlarged 1.3x); `auto`
    for the synthetic renders (`crops.SYNTHETIC`: aligned where the extra is installed, else box).
    None when a run starts: the prepared data's (its manifest.json; box where none says), or auto
    for synthetic data; a run saved before the key has box crops. A record of
    the data, not a choice of it: a relaunch may change it (a run saved before it resumes)."""
    layout: str = "auto"
    """The on-disk data's layout (`triskele.train.domains.deepfake.layouts`: ffpp, celeb-df, dfdc,
    dfdcp, uadfv, generic, deepfakebench); `auto` detects it."""


def _methods(text: str | None) -> tuple[str, ...] | None:
    return tuple(m.strip() for m in text.split(",") if m.strip()) if text else None


FAKES = ("sbi", "supervised")


def resolve(config) -> None:
    """Refuses options that name nothing and records the run's face crops, when a run starts."""
    from triskele.train.data.packed import is_packed, packed_value
    from triskele.train.domains.deepfake.crops import check_face_crops, training_crops
    from triskele.train.domains.deepfake.data import FAMILIES
    from triskele.train.domains.deepfake.landmarks import check_sbi_mask
    from triskele.train.domains.deepfake.layouts import check_layout_name

    options = config.options
    if options.fakes not in FAKES:
        raise ValueError(f"config key 'deepfake.fakes' is {options.fakes!r}; choose one of {', '.join(FAKES)}")
    check_layout_name(options.layout)
    check_sbi_mask(options.sbi_mask)
    if options.face_crops is None and is_packed(config.data.path):
        options.face_crops = packed_value(config.data.path, "deepfake.face_crops")
    if options.face_crops is None:
        options.face_crops = training_crops(config.data.path)
    check_face_crops(options.face_crops)
    if options.holdout is not None and not config.data.path and options.holdout not in FAMILIES:
        raise ValueError(f"config key 'deepfake.holdout' is {options.holdout!r}; the synthetic training families "
                         f"are {', '.join(FAMILIES)}")


PACK_KEYS = ("model.image_size", "model.frames", "deepfake.frames_per_video", "deepfake.compression",
             "deepfake.layout", "deepfake.fakes", "deepfake.holdout", "deepfake.eval_methods", "deepfake.sbi_mask",
             "deepfake.face_crops", "data.val_fraction")
"""What chooses and shapes a deepfake record before augmentation: the crops' size and method, the
frames sampled per video (a clip's), which videos each split holds, and the face regions of
self-blended training."""


def open_split(config, split: str) -> Source:
    import jax
    from triskele.train.data.packed import is_packed
    from triskele.train.domains.deepfake.data import FAMILIES, FaceFrames, SyntheticFaces
    from triskele.train.domains.deepfake.sbi import SelfBlendedFaces, pool_without

    options, frames = config.options, config.model.frames
    self_blended = options.fakes == "sbi" and check_split(split) == "train"
    # Validation is held out of training and looks like it (its methods less the held-out family);
    # eval_methods choose the test split's.
    holdout = (options.holdout,) if options.holdout and split != "test" and not self_blended else ()
    chosen = _methods(options.eval_methods) if split == "test" else None
    if is_packed(config.data.path):
        from triskele.train.data.packed import open_packed
        from triskele.train.domains.deepfake.data import PackedFaces

        source = PackedFaces(open_packed(config, split, PACK_KEYS))
        if jax.process_index() == 0:
            print(source.report(), flush=True)
    elif config.data.path:
        source = FaceFrames(config.data.path, split, config.model.image_size, options.frames_per_video, frames,
                            methods=chosen, exclude=holdout, compression=options.compression, reals_only=self_blended,
                            val_fraction=config.data.val_fraction, limits=config.limits, layout=options.layout,
                            sbi_mask=options.sbi_mask, face_crops=options.face_crops)
        if jax.process_index() == 0:
            print(source.report(), flush=True)
    else:
        families = chosen or (tuple(f for f in FAMILIES if f not in holdout) if split != "test" else None)
        size = config.data.train_size if split == "train" else config.data.eval_size
        source = SyntheticFaces(split, size, config.model.image_size,
                                options.frames_per_video, seed=config.run.seed, families=families, clip_frames=frames,
                                sbi_mask=options.sbi_mask)
    return SelfBlendedFaces(source, pool_without(options.holdout), config.run.seed) if self_blended else source


def build_model(config, rngs: nnx.Rngs, stages: int) -> FrameDetector | VideoDetector:
    from triskele.models.deepfake import FrameDetector, VideoDetector
    from triskele.train.backbone import vit_config

    vit = vit_config(config, stages)
    if config.model.frames > 1:
        return VideoDetector(vit, config.model.frames, rngs=rngs)
    return FrameDetector(vit, rngs=rngs)


SPEC = Domain(
    name="deepfake", summary="real/fake detection of face crops, per frame and per video",
    options=DeepfakeOptions,
    preset={"model.channels": 3, "deepfake.frames_per_video": 8, "data.train_size": 6144, "data.eval_size": 1024,
            "run.steps": 3000, "run.eval_every": 750},
    build_model=build_model, open_split=open_split, resolve=resolve, class_names=lambda config: ["real", "fake"],
    evaluator=Later("triskele.train.domains.deepfake.evaluator", "DeepfakeEvaluator"),
    metric_names=Later("triskele.train.domains.deepfake.metrics", "NAMES"), inference="triskele.eval.domains.deepfake",
    evaluate_flags=(Flag("--holdout", "evaluate only this manipulation method's fakes (with all reals)",
                         metavar="METHOD", key="deepfake.eval_methods"),
                    Flag("--layout", "the --data's layout: auto (detected) or one of ffpp, celeb-df, dfdc, dfdcp, "
                         "uadfv, generic, deepfakebench (default: the run's, auto unless its training named one)",
                         metavar="NAME", key="deepfake.layout"),
                    Flag("--frames-per-video", "frames sampled per video (default: the run's; DeepfakeBench's "
                         "test protocol samples 32)", type=bounded(int, 1), metavar="N",
                         key="deepfake.frames_per_video")),
    predict_flags=(Flag("--save-faces", "keep the face crops found in videos here", metavar="DIR", type=folder),
                   Flag("--frames-per-video", "frames sampled per video or folder of crops (default 32, "
                        "DeepfakeBench's, whatever the run trained on)", type=bounded(int, 1), metavar="N"),
                   Flag("--as", "read each folder of images as one video's face-crop frames or as photos scored "
                        "each on its own (default: frames where every name is a frame number, else photos)",
                        choices=("video", "images"), dest="read_as"),
                   Flag("--faces", "who finds faces in videos and photos: dlib's HOG detector on the host "
                        "(DeepfakeBench's protocol, the default) or blazeface on the accelerator, a batch of "
                        "frames at a time", choices=FACE_DETECTORS),
                   Flag("--sample", "which frames a video gives: uniform over the stream (default) or runs from "
                        "keyframes (every frame decoded is kept)", choices=SAMPLING),
                   Flag("--decode", "seek: decode only what is sampled, from the keyframe before each frame "
                        "(default); all: the whole stream", choices=DECODING),
                   Flag("--detect-every", "with --faces blazeface, find faces on every N-th sampled frame, the "
                        "track carried between (default 1)", type=bounded(int, 1), metavar="N")),
    resume_options=("eval_methods", "face_crops"), pack_keys=PACK_KEYS, pack_codecs={"region": "zlib"},
    legacy_defaults={"face_crops": OLD_RUNS}, clips=True,
    prepare=PREPARE,
)
