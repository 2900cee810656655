"""Deepfake predictions: per-video scores of video files or folders of face crops; the evaluation
(metrics as DeepfakeBench computes them, ROC plot) is `triskele.train.domains.deepfake.evaluator`."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from triskele.train.config.schema import InputLimits

PREDICT_FRAMES_PER_VIDEO = 32
"""Frames predict samples per video unless `--frames-per-video` says otherwise: DeepfakeBench's
test-time count, whatever the run trained on."""

COMMANDS: dict = {}
"""Deepfake has no eval commands of its own (its `prepare` is a training command)."""


@dataclasses.dataclass
class _Found:
    """What one input gave the model: its records' names and face boxes, and the counts."""

    names: list[str]
    boxes: list[str]
    frames_sampled: int
    faces_found: int
    reason: str = ""
    crops: list[np.ndarray] | None = None
    read_as: str = "video"
    """How the input was read: a video file, a folder of its frames, or a photo."""
    frames_decoded: int = 0


READ_AS = ("video", "images")
"""How a folder of images is read (`--as`): one video of face-crop frames, or each image a photo."""


def holds_frames(files: list[Path]) -> bool:
    """Whether a folder's images are a video's frames: every name a frame number (`000123.png`, as
    `prepare` and DeepfakeBench's frame layouts write them); anything else is a folder of photos."""
    return all(f.stem.isdigit() for f in files)


class DeepfakeIO:
    """Inputs are videos or photos: a video file (.mp4 .avi .mov .mkv .webm), whose faces are found as
    DeepfakeBench finds them (`triskele.train.domains.deepfake.faces`) and cropped as the run's were
    (`meta["options"]["face_crops"]`: aligned on 5 landmarks, or the box; never by what is installed);
    a folder of a video's face crops, read as they are (frames directly under the input root form one
    video named after the root); or a still photo, whose face is found and cropped as a video frame's
    and scored on its own (none found: no score, and the reason). A folder of images is a video's
    frames when every name is a frame number (`holds_frames`), else its images are photos; `read_as`
    (`--as video|images`) says so instead. The frame model scores `frames_per_video` frames (default
    `PREDICT_FRAMES_PER_VIDEO`) sampled uniformly and a video gets their mean; the video model scores
    one clip of `model.frames` of them. `videos.csv` (video, frames_sampled, faces_found, records,
    fake_probability, reason: why a video has no score) and, for the frame model, `frames.csv` (per
    frame, with the face box); `save_faces` keeps the crops. Videos and crops are read within `limits`
    (frame size and count from a video's header, pixels from a crop's)."""

    def __init__(self, meta: dict[str, Any], save_faces: Path | None = None, limits: InputLimits | None = None,
                 frames_per_video: int | None = None, read_as: str | None = None, faces: str | None = None,
                 sample: str | None = None, decode: str | None = None, detect_every: int | None = None):
        from triskele.train.data.images import IMAGE_SUFFIXES
        from triskele.train.domains.deepfake.crops import run_crops, usable_crops
        from triskele.train.domains.deepfake.detectors import DLIB, check_face_detector
        from triskele.train.domains.deepfake.seek import UNIFORM
        from triskele.train.domains.deepfake.video import SEEK, VIDEO_SUFFIXES

        self.size, self.clip = meta["image_size"], meta["frames"]
        self.crops = usable_crops(run_crops(meta["options"]))
        self.per_video = frames_per_video or PREDICT_FRAMES_PER_VIDEO
        if self.per_video < self.clip:
            raise ValueError(f"--frames-per-video {self.per_video} is below the {self.clip} frames of the video "
                             f"model's clip; give {self.clip} or more")
        self.save_faces = Path(save_faces) if save_faces else None
        self.limits = limits
        self.suffixes = tuple(sorted({s.lower() for s in IMAGE_SUFFIXES} | set(VIDEO_SUFFIXES)))
        self.videos_read = f" and {', '.join(s[1:].upper() for s in VIDEO_SUFFIXES)} videos"
        """What is read besides images, as the refusal of another file names it."""
        if read_as not in (None, *READ_AS):
            raise ValueError(f"--as {read_as!r}: choose {' or '.join(READ_AS)} (default: told by each folder's names)")
        self.read_as = read_as
        self.finding = {"faces": check_face_detector(faces or DLIB), "sample": sample or UNIFORM,
                        "decode": decode or SEEK, "detect_every": detect_every or 1}
        """How a video's frames are reached and its faces found (`faces.video_faces`), recorded in
        every row of videos.csv."""
        self.photos: set[str] = set()
        """The keys of the units that are photos (`units`)."""

    def units(self, root: Path, files: list[Path]):
        from triskele.eval.engine import Unit, file_units
        from triskele.eval.inputs import relative_name
        from triskele.train.domains.deepfake.video import VIDEO_SUFFIXES

        units = file_units(root, [f for f in files if f.suffix.lower() in VIDEO_SUFFIXES])
        folders: dict[Path, list[Path]] = {}
        for image in (f for f in files if f.suffix.lower() not in VIDEO_SUFFIXES):
            folders.setdefault(image.parent, []).append(image)
        photos = []
        for folder, images in folders.items():
            if self.read_as == "images" or (self.read_as is None and not holds_frames(images)):
                photos += images
                continue
            units.append(Unit(root.name if folder.resolve() == root.resolve() else relative_name(folder, root),
                              tuple(sorted(images))))
        photo_units = file_units(root, sorted(photos))
        self.photos = {unit.key for unit in photo_units}
        return sorted(units + photo_units, key=lambda u: u.key)

    def _records(self, crops: list, names: list[str], boxes: list[str], sampled: int) -> tuple[np.ndarray, _Found]:
        """The model's records from face crops (uint8 arrays or crop files), as training reads them."""
        from triskele.models.preprocess import to_model_input
        from triskele.train.data.images import open_image
        from triskele.train.domains.deepfake.data import sample_uniformly

        def model_input(crop) -> np.ndarray:
            picture = (Image.fromarray(crop) if isinstance(crop, np.ndarray)
                       else open_image(crop, self.limits, also_read=self.videos_read))
            return to_model_input(picture, self.size, 3)

        found = _Found(names, boxes, sampled, len(crops))
        if self.clip == 1:
            records = np.stack([model_input(c) for c in crops]) if crops else np.zeros((0, self.size, self.size, 3))
            return records.astype(np.float32), found
        clip = sample_uniformly(list(range(len(crops))), self.clip)
        if len(clip) < self.clip:
            found.reason = found.reason or f"{len(clip)} frames with a face; the video model needs {self.clip}"
            return np.zeros((0, self.clip, self.size, self.size, 3), np.float32), found
        found.names, found.boxes = ["clip"], [""]
        return np.stack([model_input(crops[i]) for i in clip])[None], found

    def read(self, unit) -> tuple[np.ndarray, Any]:
        from triskele.train.data.images import EncodedImage
        from triskele.train.domains.deepfake.data import sample_uniformly
        from triskele.train.domains.deepfake.video import VIDEO_SUFFIXES, video_suffix

        first = unit.paths[0]
        if isinstance(first, EncodedImage) and (suffix := video_suffix(first.data[:16])) is not None:
            return self._sent_video(first, suffix)
        if first.suffix.lower() in VIDEO_SUFFIXES:
            return self._video(first, str(first))
        if unit.key in self.photos:
            return self._photo(first)
        chosen = sample_uniformly(list(unit.paths), self.per_video)
        records, found = self._records(chosen, [p.name for p in chosen], [""] * len(chosen), len(chosen))
        found.read_as = "frames"
        return records, found

    def _photo(self, path: Path) -> tuple[np.ndarray, _Found]:
        """A still photo: its face found and cropped as a video frame's (`photo_face`), scored alone."""
        from triskele.train.data.images import open_image
        from triskele.train.domains.deepfake.faces import photo_face

        photo = open_image(path, self.limits, also_read=self.videos_read).convert("RGB")
        face = photo_face(np.asarray(photo), self.size, self.crops, self.finding["faces"])
        crops, boxes = ([face[1]], [" ".join(map(str, face[0]))]) if face else ([], [])
        records, found = self._records(crops, [path.name] * len(crops), boxes, 1)
        found.read_as = "photo"
        found.reason = found.reason if face else "no face found in the photo"
        found.crops = crops if self.save_faces else None
        return records, found

    def _video(self, path: Path, name: str) -> tuple[np.ndarray, _Found]:
        """A video file's faces (errors call it `name`) into records, as predict reads it."""
        from triskele.train.domains.deepfake.faces import video_faces

        try:
            faces = video_faces(path, self.per_video, limits=self.limits, crops=self.crops, **self.finding)
        except ValueError as err:
            raise ValueError(str(err).replace(str(path), name)) from None
        records, found = self._records(faces.crops, [f"{i:06d}" for i in faces.indices],
                                       [" ".join(map(str, b)) for b in faces.boxes], faces.frames_sampled)
        found.reason = faces.reason or found.reason
        found.crops = faces.crops if self.save_faces else None
        found.frames_decoded = faces.frames_decoded
        return records, found

    def _sent_video(self, sent: Any, suffix: str) -> tuple[np.ndarray, _Found]:
        """A video sent as bytes (served): OpenCV reads files only, so it is read from a private
        temporary file (removed at once) with the checks and sampling of a video file."""
        import tempfile

        with tempfile.TemporaryDirectory(prefix="triskele-video-") as folder:
            path = Path(folder) / f"video{suffix}"
            path.write_bytes(sent.data)
            return self._video(path, sent.name)

    serving_outputs = {"fake_probability": ("FP32", []), "faces_found": ("INT32", []), "reason": ("BYTES", [])}
    """What the server answers for one input, a face image or a video file (`respond`): name ->
    (datatype, shape)."""

    def respond(self, found: _Found, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The input's fake probability as predict's videos.csv gives it (a face image: its own; a
        video: the mean over its scored faces, NaN with the reason when none is), the faces found."""
        probability = video_probability(outputs)
        return {"fake_probability": np.asarray(np.nan if probability is None else probability, np.float32),
                "faces_found": np.asarray(found.faces_found, np.int32), "reason": np.asarray(found.reason, object)}

    def write(self, unit, found: _Found, outputs: dict[str, np.ndarray], out_dir: Path) -> dict[str, Any]:
        import io

        from triskele.train.bookkeeping.files import write_atomically

        scores = [float(p) for p in outputs.get("fake_probability", [])]
        for name, crop in zip(found.names, found.crops or [], strict=False):
            buffer = io.BytesIO()
            Image.fromarray(crop).save(buffer, format="PNG")
            write_atomically(self.save_faces / unit.key / f"{name}.png", buffer.getvalue())
        frames = [[n, p, b] for n, p, b in zip(found.names, scores, found.boxes, strict=False)]
        return {"video": unit.key, "frames_sampled": found.frames_sampled, "faces_found": found.faces_found,
                "records": len(scores), "fake_probability": video_probability(outputs),
                "reason": found.reason, "read_as": found.read_as, "frames": frames,
                "frames_decoded": found.frames_decoded, **self.finding}

    def finish(self, rows: list[dict[str, Any]], out_dir: Path) -> list[str]:
        from triskele.eval.engine import write_csv

        def score(p: float | None) -> str:
            return "" if p is None else f"{p:.6f}"

        written = ["videos.csv"]
        write_csv(out_dir / "videos.csv",
                  ["video", "frames_sampled", "faces_found", "records", "fake_probability", "reason", "read_as",
                   "frames_decoded", "faces", "sample", "decode"],
                  [[r["video"], r["frames_sampled"], r["faces_found"], r["records"], score(r["fake_probability"]),
                    r["reason"], r.get("read_as", "video"), r.get("frames_decoded", 0),
                    *(r.get(key, self.finding[key]) for key in ("faces", "sample", "decode"))] for r in rows])
        if self.clip == 1:
            write_csv(out_dir / "frames.csv", ["video", "frame", "fake_probability", "box"],
                      [[r["video"], name, score(p), box] for r in rows for name, p, box in r["frames"]])
            written.append("frames.csv")
        return written


def video_probability(outputs: dict[str, np.ndarray]) -> float | None:
    """A video's fake probability: the mean of its scored records' (None: no face was scored)."""
    scores = outputs.get("fake_probability", [])
    return float(np.mean(np.asarray(scores, np.float64))) if len(scores) else None


def predict_io(meta: dict[str, Any], options: dict[str, Any], workdir: Path | None = None) -> DeepfakeIO:
    """`options`: the deepfake predict flags given (`save_faces`, `frames_per_video`);
    `meta['limits']`: the input limits (default `InputLimits()`). A run whose crops are aligned is
    refused here, before any input is read, where the landmarks extra is not installed."""
    from triskele.eval.model import describe_model
    from triskele.train.domains.deepfake.crops import ALIGNED, check_aligner, run_crops

    io = DeepfakeIO(meta, **options, limits=meta.get("limits"))
    if run_crops(meta["options"]) == ALIGNED:
        run = f"the run {workdir}" if workdir else describe_model(meta.get("identity"))
        check_aligner(f"{run} was trained on face crops aligned on 5 landmarks (deepfake.face_crops=aligned), "
                      "and its videos' faces are cropped so")
    return io
