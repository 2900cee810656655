"""Deepfake data: procedural faces with blended fakes, and face frames on disk in any dataset layout.

Synthetic fakes alter the same face by one manipulation family (colour shift, exposure,
down-then-up resampling, sharpening) and blend it back through a jittered, elastically deformed,
blurred mask of the inner face. The test split also holds two families no training recipe makes:
`Swap` (another identity's inner face, colour-matched and blended in) and `Warp` (the eyes and
mouth geometrically warped and blended back). Real and fake frames alike are JPEG-compressed at a
random quality. Real and fake videos come in pairs of the same identity, so identity is no
shortcut. A video is T frames of one identity with small motion; a fake keeps its blend across
frames with slight flicker. Every record carries its family's code (`FAMILY_NAMES`; 0 = real).
"""

from __future__ import annotations

import functools
import io
import logging
from pathlib import Path

import numpy as np
from PIL import Image
from scipy import ndimage
from triskele.models.preprocess import model_input_pixels, square_crop_box, to_unit_range
from triskele.train.config.schema import InputLimits
from triskele.train.data.images import IMAGE_SUFFIXES, image_size, open_image
from triskele.train.data.packed import PackedRecords
from triskele.train.data.pipeline import RecordCache
from triskele.train.data.splits import check_split
from triskele.train.domains.deepfake.crops import MANIFEST, SYNTHETIC, prepared_crops
from triskele.train.domains.deepfake.drawn_landmarks import drawn_landmarks
from triskele.train.domains.deepfake.faces import crop_face_region
from triskele.train.domains.deepfake.landmarks import (
    INSTALL,
    check_sbi_mask,
    hull_region,
    landmarks_file,
    read_landmarks,
    say_once,
)
from triskele.train.domains.deepfake.layouts import AUTO, Tree, Video, find_layout, split_videos

FAMILIES = ("ColorShift", "Exposure", "Resample", "Sharpen")
"""The families a supervised detector trains on (and the self-blending pool resembles)."""
UNSEEN_FAMILIES = ("Swap", "Warp")
"""Families of the synthetic test split only: no training recipe makes them."""
FAMILY_NAMES = ("real", *FAMILIES, *UNSEEN_FAMILIES)
"""A synthetic record's `family` code is its index here."""
_SPLIT_OFFSET = {"train": 0, "val": 1, "test": 2}


def _ellipse(rows, cols, cy, cx, ry, rx) -> np.ndarray:
    return ((rows - cy) / ry) ** 2 + ((cols - cx) / rx) ** 2


def _identity(seed: int, identity: int) -> dict:
    rng = np.random.default_rng([seed, 7, identity])
    r = rng.uniform(0.45, 0.95)
    g = r * rng.uniform(0.6, 0.85)
    return {
        "skin": np.array([r, g, g * rng.uniform(0.6, 0.9)]),
        "bg": rng.uniform(0.1, 0.9, size=(2, 3)),
        "hair": rng.uniform(0.02, 0.6) * np.array([1.0, rng.uniform(0.6, 1.0), rng.uniform(0.3, 0.9)]),
        "center": (rng.uniform(0.5, 0.58), rng.uniform(0.45, 0.55)),
        "radii": (rng.uniform(0.34, 0.4), rng.uniform(0.26, 0.32)),
        "eye_dx": rng.uniform(0.1, 0.14), "eye_y": rng.uniform(-0.1, -0.06), "eye_r": rng.uniform(0.03, 0.045),
        "iris": rng.uniform(0.05, 0.5, size=3),
        "mouth_y": rng.uniform(0.15, 0.2), "mouth_w": rng.uniform(0.08, 0.13),
        "lips": np.array([rng.uniform(0.5, 0.8), rng.uniform(0.15, 0.35), rng.uniform(0.2, 0.35)]),
        "hairline": rng.uniform(0.15, 0.3),
        "light": rng.uniform(0, 2 * np.pi), "light_strength": rng.uniform(0.05, 0.25),
        "pore_seed": int(rng.integers(1 << 30)), "pore": rng.uniform(0.02, 0.05),
    }


def render_face(ident: dict, size: int, shift: tuple[float, float] = (0.0, 0.0),
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(RGB float image, inner-face region, whole face region; regions in {0, 1}) of one identity,
    moved by `shift` pixels."""
    rows, cols = np.mgrid[0:size, 0:size].astype(np.float64) + 0.5
    cy, cx = ident["center"][0] * size + shift[0], ident["center"][1] * size + shift[1]
    ry, rx = ident["radii"][0] * size, ident["radii"][1] * size
    t = rows / size
    image = ident["bg"][0] * (1 - t[..., None]) + ident["bg"][1] * t[..., None]
    face = _ellipse(rows, cols, cy, cx, ry, rx) < 1
    light = np.cos(ident["light"]) * (cols - cx) / rx + np.sin(ident["light"]) * (rows - cy) / ry
    pores = np.random.default_rng(ident["pore_seed"]).normal(0, ident["pore"], size=(size, size))
    skin = ident["skin"] * (1 + ident["light_strength"] * light[..., None]) + pores[..., None]
    image = np.where(face[..., None], skin, image)
    hair = face & (rows < cy - ry * (1 - 2 * ident["hairline"])) | (
        (_ellipse(rows, cols, cy - 0.15 * ry, cx, 1.05 * ry, 1.1 * rx) < 1) & ~face & (rows < cy)
    )
    image = np.where(hair[..., None], ident["hair"] + 0.04 * pores[..., None], image)
    er = ident["eye_r"] * size
    for side in (-1, 1):
        ey, ex = cy + ident["eye_y"] * size, cx + side * ident["eye_dx"] * size
        white = _ellipse(rows, cols, ey, ex, 0.6 * er, er) < 1
        iris = _ellipse(rows, cols, ey, ex, 0.55 * er, 0.55 * er) < 1
        brow = (_ellipse(rows, cols, ey - 1.6 * er, ex, 0.3 * er, 1.3 * er) < 1)
        image = np.where(white[..., None], 0.92, image)
        image = np.where(iris[..., None], ident["iris"], image)
        image = np.where(brow[..., None], ident["hair"], image)
    nose = _ellipse(rows, cols, cy + 0.05 * size, cx + 0.01 * size, 0.06 * size, 0.025 * size) < 1
    image = np.where(nose[..., None], image * 0.85, image)
    mouth = _ellipse(rows, cols, cy + ident["mouth_y"] * size, cx, 0.025 * size, ident["mouth_w"] * size) < 1
    image = np.where(mouth[..., None], ident["lips"], image)
    inner = _ellipse(rows, cols, cy + 0.04 * size, cx, 0.7 * ry, 0.78 * rx) < 1
    return np.clip(image, 0, 1), inner.astype(np.float64), face.astype(np.float64)


def _manipulate(image: np.ndarray, family: str, rng: np.random.Generator) -> np.ndarray:
    """The altered face that a fake blends in; each family has its own settings."""
    if family == "ColorShift":
        return image + rng.choice([-1, 1], size=3) * rng.uniform(0.08, 0.18, size=3)
    if family == "Exposure":
        contrast = rng.choice([rng.uniform(0.55, 0.8), rng.uniform(1.25, 1.5)])
        return (image - image.mean()) * contrast + image.mean() + rng.choice([-1, 1]) * rng.uniform(0.08, 0.16)
    if family == "Resample":
        size = image.shape[0]
        small = max(size // int(rng.integers(2, 5)), 4)
        pil = Image.fromarray((np.clip(image, 0, 1) * 255).astype(np.uint8))
        down = pil.resize((small, small), Image.BILINEAR)
        return np.asarray(down.resize((size, size), Image.NEAREST if rng.random() < 0.5 else Image.BILINEAR)) / 255.0
    if family == "Sharpen":
        blurred = ndimage.gaussian_filter(image, sigma=(1.0, 1.0, 0))
        return image + rng.uniform(2.0, 4.0) * (image - blurred)
    raise ValueError(f"unknown manipulation family {family!r}; families are {', '.join(FAMILIES)}")


def _blend_mask(inner: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Jittered (scale, shift), elastically deformed and blurred version of the inner-face region."""
    size = inner.shape[0]
    rows, cols = np.mgrid[0:size, 0:size].astype(np.float64)
    scale = rng.uniform(0.85, 1.1)
    cy, cx = size / 2 + rng.normal(0, 1.5), size / 2 + rng.normal(0, 1.5)
    coarse = rng.normal(0, size * 0.03, size=(2, 4, 4))
    flow = [ndimage.zoom(c, size / 4, order=3)[:size, :size] for c in coarse]
    src_r = (rows - cy) / scale + size / 2 + flow[0]
    src_c = (cols - cx) / scale + size / 2 + flow[1]
    warped = ndimage.map_coordinates(inner, [src_r, src_c], order=1, mode="constant")
    return np.clip(ndimage.gaussian_filter(warped, rng.uniform(0.5, 2.0)), 0, 1)


def jpeg(image: np.ndarray, quality: int) -> np.ndarray:
    buffer = io.BytesIO()
    Image.fromarray((np.clip(image, 0, 1) * 255).round().astype(np.uint8)).save(buffer, "JPEG", quality=quality)
    return np.asarray(Image.open(buffer), np.float32) / 255.0


def _colour_matched(donor: np.ndarray, target: np.ndarray, region: np.ndarray) -> np.ndarray:
    """`donor` with its face region's per-channel mean and spread moved to `target`'s."""
    inside = region > 0.5
    d, t = donor[inside], target[inside]
    return (donor - d.mean(0)) / (d.std(0) + 1e-6) * t.std(0) + t.mean(0)


def _feature_warp(image: np.ndarray, ident: dict, shift: tuple[float, float], rng: np.random.Generator,
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(image with eyes magnified and mouth stretched, the warped features' region)."""
    size = image.shape[0]
    rows, cols = np.mgrid[0:size, 0:size].astype(np.float64) + 0.5
    cy, cx = ident["center"][0] * size + shift[0], ident["center"][1] * size + shift[1]
    er = ident["eye_r"] * size
    eyes = [(cy + ident["eye_y"] * size, cx + side * ident["eye_dx"] * size) for side in (-1, 1)]
    mouth = (cy + ident["mouth_y"] * size, cx)
    src_r, src_c, region = rows.copy(), cols.copy(), np.zeros((size, size))
    eye_scale = rng.uniform(1.25, 1.5)
    mouth_scale = (rng.uniform(0.6, 1.6), rng.uniform(1.2, 1.5))
    features = [(ey, ex, 2.2 * er, 2.2 * er, (eye_scale, eye_scale)) for ey, ex in eyes]
    features.append((*mouth, 0.06 * size, ident["mouth_w"] * size * 1.4, mouth_scale))
    for fy, fx, ry, rx, (sy, sx) in features:
        weight = np.exp(-(((rows - fy) / ry) ** 2 + ((cols - fx) / rx) ** 2))
        src_r -= weight * (rows - fy) * (1 - 1 / sy)
        src_c -= weight * (cols - fx) * (1 - 1 / sx)
        region = np.maximum(region, (_ellipse(rows, cols, fy, fx, 1.4 * ry, 1.4 * rx) < 1).astype(np.float64))
    warped = np.stack([ndimage.map_coordinates(image[..., c], [src_r - 0.5, src_c - 0.5], order=1, mode="nearest")
                       for c in range(3)], axis=-1)
    return warped, region


def _reenacted(ident: dict, size: int, shift: tuple[float, float], rng: np.random.Generator) -> np.ndarray:
    """The face as a reenactment generator renders it: wider eyes, a wider and moved mouth, its own
    skin texture (pores) and a turned light. Only the eye and mouth regions are kept (`Warp`), so
    the texture and the light change at the blend's edge: a seam, as a re-rendered mouth leaves."""
    expression = {**ident, "eye_r": ident["eye_r"] * rng.uniform(1.1, 1.3),
                  "mouth_w": ident["mouth_w"] * rng.uniform(1.15, 1.4),
                  "mouth_y": ident["mouth_y"] + rng.uniform(-0.02, 0.02),
                  "light": ident["light"] + rng.choice([-1, 1]) * rng.uniform(0.5, 1.2),
                  "pore_seed": int(rng.integers(1 << 30)), "pore": ident["pore"] * rng.uniform(0.5, 1.5)}
    return render_face(expression, size, shift)[0]


def _fake_frame(image: np.ndarray, inner: np.ndarray, ident: dict, family: str, shift: tuple[float, float],
                states: tuple[int, int], seed: int, video: int) -> tuple[np.ndarray, np.ndarray]:
    """(altered face, blend mask) of one frame; `states` seed the family's and the mask's draws, the
    same for every frame of the video."""
    manip_rng, mask_rng = np.random.default_rng(states[0]), np.random.default_rng(states[1])
    if family == "Swap":  # another identity with this face's geometry (as landmarks align a swap)
        donor = {**_identity(seed, 5_000_000 + video), "center": ident["center"], "radii": ident["radii"]}
        altered = _colour_matched(render_face(donor, image.shape[0], shift)[0], image, inner)
        return altered, _blend_mask(inner, mask_rng)
    if family == "Warp":  # reenactment: eyes and mouth re-rendered with another expression, blended back
        altered, region = _feature_warp(_reenacted(ident, image.shape[0], shift, manip_rng), ident, shift, manip_rng)
        sigma = mask_rng.uniform(0.8, 2.0) * image.shape[0] / 64
        return altered, np.clip(ndimage.gaussian_filter(region, sigma), 0, 1)
    return _manipulate(image, family, manip_rng), _blend_mask(inner, mask_rng)


def render_video(seed: int, video: int, size: int, frames: int, family: str | None, compress: bool = True,
                 hull: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
    """Frames (T, size, size, 3) float32, blend masks (T, size, size) uint8 (0 everywhere for a
    real video), face regions (T, size, size) uint8 and each frame's JPEG quality: video `video`,
    real if `family` is None, else faked by that family. `compress` False: the frames before their
    JPEG (what self-blending blends, `capture` compresses them as these are). The face region is the
    drawn face oval, or with `hull` its drawn landmarks' convex hull.

    Videos 2k and 2k+1 share identity k, so a real and a fake video of each face exist.
    """
    ident = _identity(seed, video // 2)
    rng = np.random.default_rng([seed, 11, video])
    walk = np.cumsum(rng.normal(0, 0.6, size=(frames, 2)), axis=0)
    fake_rng = np.random.default_rng([seed, 13, video])
    mask_state = fake_rng.integers(1 << 30)
    manip_state = fake_rng.integers(1 << 30)
    focus = rng.uniform(0.0, 0.55)  # camera blur of the whole frame: smoothness alone is no cue
    out, blends, regions, qualities = [], [], [], []
    for t in range(frames):
        image, inner, face = render_face(ident, size, tuple(walk[t]))
        mask = np.zeros((size, size, 1))
        if family is not None:
            altered, mask = _fake_frame(image, inner, ident, family, tuple(walk[t]), (manip_state, mask_state),
                                        seed, video)
            flicker = 1.0 + 0.08 * rng.normal()
            mask = np.clip(mask * flicker, 0, 1)[..., None]
            image = np.clip(mask * altered + (1 - mask) * image, 0, 1)
        if focus > 0.15:
            image = ndimage.gaussian_filter(image, sigma=(focus, focus, 0))
        qualities.append(int(rng.integers(75, 96)))
        out.append(jpeg(image, qualities[-1]) if compress else image.astype(np.float32))
        blends.append((mask[..., 0] * 255).round().astype(np.uint8))
        region = hull_region(drawn_landmarks(ident, size, tuple(walk[t])), size) if hull else face
        regions.append((region * 255).astype(np.uint8))
    return np.stack(out), np.stack(blends), np.stack(regions), qualities


class SyntheticFaces:
    """Random-access synthetic split of videos; records are frames (`clip_frames` 1) or clips.

    Video v is fake when v is odd, with a family chosen from `families` by a hash of v (default:
    the training families, and on the test split the unseen ones too). Its real videos are also
    the `RealFaces` a self-blended training split draws from, whose face region `sbi_mask` chooses
    (`landmarks.SBI_MASKS`: `hull` the drawn landmarks' hull, else the drawn face oval).
    """

    family_names = FAMILY_NAMES

    def __init__(self, split: str, num_records: int, image_size: int, frames_per_video: int, seed: int = 0,
                 families: tuple[str, ...] | None = None, clip_frames: int = 1, cache_bytes: int = 256 << 20,
                 sbi_mask: str = "auto"):
        if split not in _SPLIT_OFFSET:
            raise ValueError(f"deepfake split {split!r} is not one of {', '.join(_SPLIT_OFFSET)}")
        allowed = FAMILIES + UNSEEN_FAMILIES if split == "test" else FAMILIES
        families = allowed if families is None else tuple(families)
        unknown = set(families) - set(allowed)
        if unknown or not families:
            only_test = " (Swap and Warp are in the test split only)" if unknown & set(UNSEEN_FAMILIES) else ""
            raise ValueError(f"manipulation families {sorted(unknown) or '()'} unknown for split {split!r}"
                             f"{only_test}; choose from {allowed}")
        self.split, self.image_size, self.seed = split, image_size, seed
        self.hull = check_sbi_mask(sbi_mask) == "hull"
        self.frames_per_video, self.clip_frames, self.families = frames_per_video, clip_frames, families
        per_record = clip_frames if clip_frames > 1 else 1
        per_video = frames_per_video // per_record if clip_frames == 1 else 1
        self.num_videos = max(num_records // max(per_video, 1), 2)
        self.num_records = self.num_videos * per_video
        self.num_reals = (self.num_videos + 1) // 2 * per_video
        self._per_video = per_video
        frame_bytes = 13 * image_size**2 * frames_per_video
        self._video = RecordCache(self._render, max(cache_bytes // frame_bytes, 2))
        self._raw = RecordCache(functools.partial(self._render, compress=False), max(cache_bytes // frame_bytes, 2))

    def __len__(self) -> int:
        return self.num_records

    def family(self, video: int) -> str | None:
        if video % 2 == 0:
            return None
        pick = np.random.default_rng([self.seed, 17, _SPLIT_OFFSET[self.split], video]).integers(len(self.families))
        return self.families[pick]

    def _render(self, video: int, compress: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
        global_video = video + _SPLIT_OFFSET[self.split] * 1_000_000
        frames = self.clip_frames if self.clip_frames > 1 else self.frames_per_video
        return render_video(self.seed, global_video, self.image_size, frames, self.family(video), compress, self.hull)

    def _record(self, index: int, compress: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, list[int]]:
        video, frame = divmod(index, self._per_video)
        frames, blends, regions, qualities = self._video(video) if compress else self._raw(video)
        if self.clip_frames == 1:
            frames, blends, regions = frames[frame], blends[frame], regions[frame]
            qualities = qualities[frame:frame + 1]
        return frames, blends, regions, video, qualities

    def load(self, index: int, rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
        if not 0 <= index < self.num_records:
            raise IndexError(f"record {index} is outside the {self.split} split of {self.num_records} records")
        frames, blends, _, video, _ = self._record(index)
        family = self.family(video)
        return augment(image=frames, label=int(video % 2), video=video, rng=rng, blend=blends,
                       family=FAMILY_NAMES.index(family) if family else 0)

    def _real_index(self, k: int) -> int:
        video, frame = divmod(k, self._per_video)
        return 2 * video * self._per_video + frame

    def real_face(self, k: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Real record k (of `num_reals`) before its JPEG: the frame or clip, its face region(s) in
        [0, 1], video."""
        frames, _, regions, video, _ = self._record(self._real_index(k), compress=False)
        return frames, regions / 255.0, video

    def capture(self, k: int, frames: np.ndarray) -> np.ndarray:
        """`frames` (real record k's shape) compressed as real record k's frames are."""
        qualities = self._record(self._real_index(k), compress=False)[4]
        flat = frames.reshape(-1, *frames.shape[-3:])
        return np.stack([jpeg(f, q) for f, q in zip(flat, qualities, strict=True)]).reshape(frames.shape)


def augment(image: np.ndarray, label: int, video: int, rng: np.random.Generator | None,
            blend: np.ndarray | None = None, family: int | None = None) -> dict[str, np.ndarray]:
    """A random horizontal flip (rng None: none), as the record dict the model reads.

    `blend` is where a fake was blended in (uint8, 255 = fully), known for synthetic fakes; on-disk
    data has none, and `blend_known` 0 keeps it out of the loss. `family` is the code of the
    record's manipulation family in its source's `family_names` (default: the label).
    """
    known = blend is not None
    if blend is None:
        blend = np.zeros(image.shape[:-1], np.uint8)
    if rng is not None and rng.random() < 0.5:
        image, blend = image[..., ::-1, :], blend[..., ::-1]
    return {"image": np.ascontiguousarray(image, np.float32), "label": np.int32(label), "video": np.int32(video),
            "blend": np.ascontiguousarray(blend), "blend_known": np.float32(known),
            "family": np.int32(label if family is None else family)}


def sample_uniformly(frames: list[Path], count: int) -> list[Path]:
    """`count` frames spread evenly over the video (all of them if it has fewer)."""
    if len(frames) <= count:
        return frames
    return [frames[i] for i in np.linspace(0, len(frames) - 1, count).round().astype(int)]


def _video_frames(folder: Path) -> list[Path]:
    frames = sorted(p for p in folder.iterdir() if p.suffix in IMAGE_SUFFIXES)
    if not frames:
        raise ValueError(f"video folder {folder} holds no frames (.png/.jpg)")
    return frames


def _listed_frames(video: Video) -> list[Path]:
    """The frames a dataset file lists for `video` (DeepfakeBench's JSON), each checked to be there."""
    for frame in video.frames:
        if not frame.is_file():
            where, entry = video.listed
            raise ValueError(f"{where} lists {'fake' if video.label else 'real'} video {entry!r} but its frame "
                             f"{frame} does not exist")
    return list(video.frames)


class FaceFrames:
    """Face-crop frames on disk, in any layout of `triskele.train.domains.deepfake.layouts` as
    `prepare deepfake` leaves it (each video a folder of crops: FaceForensics++'s
    `original_sequences/youtube/<c>/frames/<vid>/NNN.png`, Celeb-DF's `Celeb-real/<vid>/`, ...,
    with the layout's label and split files) or a DeepfakeBench dataset JSON; `layout` names it
    (`auto`: detected). Without a val split of its own, val is the `val_fraction` of the training
    videos held out by a hash of the video's group (an FF++ pair's reals and fakes, or, without the
    pairs, real a and the fakes a_*; a generic layout's same-named videos; a Celeb-DF identity), so
    no face of a validation video is trained on. A video a label or split file lists must be there
    (or be one `prepare` found no face in: left out and reported). Records are frames
    (`clip_frames` 1) or clips of `clip_frames` frames; `frames_per_video` frames are sampled
    uniformly from each video. A record's family is its fakes' method (FF++'s, Celeb-DF's
    `Celeb-synthesis`, ...; `fake` for the generic layout). `reals_only` reads the real videos alone
    (for self-blended training, whose face region `sbi_mask` chooses, `landmarks.SBI_MASKS`: a crop's
    stored landmarks' hull, or `crop_face_region`). Frames are read within `limits`. `face_crops`,
    the run's method (`crops.FACE_CROPS`), must be the tree's where its manifest.json names one (a
    run on synthetic faces, cropped by neither, scores either); a tree whose manifest mixes both is
    refused whatever the run.
    """

    def __init__(self, root: str | Path, split: str, image_size: int, frames_per_video: int,
                 clip_frames: int = 1, methods: tuple[str, ...] | None = None, exclude: tuple[str, ...] = (),
                 compression: str = "c23", reals_only: bool = False, val_fraction: float = 0.0,
                 limits: InputLimits | None = None, layout: str = AUTO, sbi_mask: str = "auto",
                 face_crops: str | None = None):
        self.root, self.split, self.image_size = Path(root), check_split(split), image_size
        self.sbi_mask = check_sbi_mask(sbi_mask)
        self.val_fraction, self.limits = val_fraction, limits
        self.clip_frames, self.reals_only = clip_frames, reals_only
        if not self.root.is_dir() and not (self.root.is_file() and self.root.suffix.lower() == ".json"):
            raise ValueError(f"data.path {str(self.root)!r} is not a folder (nor a DeepfakeBench dataset JSON)")
        self.face_crops = prepared_crops(self.root) if self.root.is_dir() else None
        if face_crops not in (None, SYNTHETIC) and self.face_crops not in (None, face_crops):
            raise ValueError(f"the data at {self.root} holds {self.face_crops} face crops ({self.root / MANIFEST}), "
                             f"but this run's are {face_crops} (deepfake.face_crops): a model scores the crops it "
                             f"was trained on; prepare the videos again with --crops {face_crops} into a new --output")
        found = find_layout(self.root, layout)
        self.layout = found.title
        tree = Tree(self.root, prepared=True)
        listing = found.read(tree, compression)
        videos, self.notes = split_videos(found, listing, tree, self.split, val_fraction, methods, exclude)
        if reals_only:
            videos = [v for v in videos if v.label == 0]
        reals, fakes = sum(1 for v in videos if v.label == 0), sum(1 for v in videos if v.label == 1)
        if not reals or not (reals_only or fakes):
            raise ValueError(f"{self.layout} data at {self.root}, split {split!r}: needs real "
                             f"{'' if reals_only else 'and fake '}videos, found {reals} real and {fakes} fake")
        self.video_names = [v.name for v in videos]
        self.family_names = ("real", *dict.fromkeys(v.family for v in videos if v.label == 1))
        self._families = [self.family_names.index(v.family) if v.label else 0 for v in videos]
        self.records: list[tuple[list[Path], int, int]] = []
        for index, video in enumerate(videos):
            frames = sample_uniformly(_listed_frames(video) if video.frames else _video_frames(tree.path(video.key)),
                                      frames_per_video)
            if clip_frames == 1:
                self.records.extend(([frame], video.label, index) for frame in frames)
            else:
                clip = sample_uniformly(frames, clip_frames)
                if len(clip) < clip_frames:
                    raise ValueError(f"video {video.name} ({tree.path(video.key)}) has {len(clip)} frames, fewer "
                                     f"than the clip length model.frames={clip_frames}")
                self.records.append((clip, video.label, index))
        self._reals = [i for i, (_, label, _) in enumerate(self.records) if label == 0]
        self.num_reals = len(self._reals)

    def report(self) -> str:
        videos = len(self.video_names)
        return (f"{self.layout} data at {self.root}, split {self.split!r}: {videos} videos, {len(self.records)} "
                "records" + "".join(f"; {note}" for note in self.notes))

    def __len__(self) -> int:
        return len(self.records)

    def _pixels(self, paths: list[Path]) -> np.ndarray:
        frames = [model_input_pixels(open_image(p, self.limits), self.image_size, 3) for p in paths]
        return np.stack(frames) if self.clip_frames > 1 else frames[0]

    def decoded(self, index: int) -> dict[str, np.ndarray]:
        """Record `index` before augmentation, as a pack stores it: its frame (or clip) at the model's
        input size as uint8, label, video, family and, for a reals-only split (self-blended training),
        each frame's face region (uint8, 1 inside)."""
        paths, label, video = self.records[index]
        record = {"image": self._pixels(paths), "label": np.int32(label), "video": np.int32(video),
                  "family": np.int32(self._families[video])}
        if self.reals_only:
            regions = np.stack([self._face_region(p) for p in paths]).astype(np.uint8)
            record["region"] = regions if self.clip_frames > 1 else regions[0]
        return record

    def load(self, index: int, rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
        paths, label, video = self.records[index]
        return augment(to_unit_range(self._pixels(paths)), label, video, rng, family=self._families[video])

    def packed_meta(self) -> dict:
        return {"family_names": list(self.family_names), "video_names": self.video_names, "reals": self._reals}

    def real_face(self, k: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Real record k (of `num_reals`), the crop's face region (per frame of a clip), video."""
        paths, _, video = self.records[self._reals[k]]
        regions = np.stack([self._face_region(p) for p in paths])
        return to_unit_range(self._pixels(paths)), regions if self.clip_frames > 1 else regions[0], video

    def _face_region(self, frame: Path) -> np.ndarray:
        """SBI's face region of one crop at the model's input size (`sbi_mask`)."""
        stored = landmarks_file(frame, self.root if self.root.is_dir() else self.root.parent)
        points = None if self.sbi_mask == "ellipse" else read_landmarks(stored)
        if points is None:
            if self.sbi_mask == "hull":
                raise ValueError(f"deepfake.sbi_mask=hull, but the crop {frame} has no landmarks ({stored}); prepare "
                                 f"its videos with the landmarks extra ({INSTALL}), or set deepfake.sbi_mask=auto")
            say_once("SBI's mask: the ellipse inscribed in the face box, for crops without stored landmarks")
            return crop_face_region(self.image_size)
        say_once("SBI's mask: the convex hull of the crops' stored landmarks", logging.INFO)
        left, top, right, _ = square_crop_box(*image_size(frame, self.limits))
        scale = self.image_size / (right - left)
        return hull_region((points - [left, top] + 0.5) * scale - 0.5, self.image_size)  # pixel centres

    def capture(self, k: int, frames: np.ndarray) -> np.ndarray:
        """Crops on disk come decoded from their videos: nothing more is done to them."""
        return frames


class PackedFaces:
    """A packed split of face crops (`triskele.train.data.packed`), read as `FaceFrames` reads its
    tree: records through `augment`, and for self-blended training its reals and their face regions."""

    def __init__(self, records: PackedRecords):
        self.records = records
        self.family_names = tuple(records.meta["family_names"])
        self.video_names = list(records.meta["video_names"])
        self._reals = list(records.meta["reals"])
        self.num_reals = len(self._reals)

    def report(self) -> str:
        return (f"packed deepfake data at {self.records.root}, split {self.records.split!r}: "
                f"{len(self.video_names)} videos, {len(self)} records")

    def __len__(self) -> int:
        return len(self.records)

    def load(self, index: int, rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
        record = self.records.decoded(index)
        return augment(to_unit_range(record["image"]), int(record["label"]), int(record["video"]), rng,
                       family=int(record["family"]))

    def real_face(self, k: int) -> tuple[np.ndarray, np.ndarray, int]:
        record = self.records.decoded(self._reals[k])
        if "region" not in record:
            raise ValueError(f"packed data {self.records.root}, split {self.records.split!r} holds no face regions: "
                             "it was packed for another deepfake.fakes; pack it with this run's keys")
        return to_unit_range(record["image"]), record["region"].astype(np.float64), int(record["video"])

    def capture(self, k: int, frames: np.ndarray) -> np.ndarray:
        return frames
