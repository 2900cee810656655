"""Who finds faces (`--faces`): dlib's HOG detector on the host, one frame at a time
(DeepfakeBench's protocol), or BlazeFace on the accelerator, a batch of frames at a time
(`device_faces`). Kept apart so that parsing a command line imports no JAX."""

DLIB, BLAZEFACE = "dlib", "blazeface"
FACE_DETECTORS = (DLIB, BLAZEFACE)


def check_face_detector(name: str) -> str:
    if name not in FACE_DETECTORS:
        raise ValueError(f"--faces {name!r}: choose {' or '.join(FACE_DETECTORS)}")
    return name
