"""BlazeFace on the accelerator: parity with MediaPipe's own .tflite run by LiteRT on real
photographs, the weights file's checksum, a missing file's error, the same boxes on 1 and 8
devices, faces where dlib finds them, and the crop cut on the device against the host's."""

import hashlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

skimage_data = pytest.importorskip("skimage.data", reason="the photographs come from scikit-image")

from triskele.models.face_detector import decode  # noqa: E402
from triskele.train.domains.deepfake import device_faces as device  # noqa: E402

REFERENCE = Path(__file__).parent / "fixtures" / "face_detector" / "face_detection_full_range.tflite"
ASTRONAUT_FACE = (179, 83, 266, 170)
"""dlib's box of the astronaut's face (tests/videoutil.py's FACE)."""


def _iou(a, b) -> float:
    width = max(0, min(a[2], b[2]) - max(a[0], b[0]))
    height = max(0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = width * height
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


@pytest.mark.parametrize("photo", ["astronaut", "coffee", "chelsea"])
def test_the_jax_detector_matches_mediapipe_s_tflite(photo):
    litert = pytest.importorskip("ai_edge_litert.interpreter", reason="the reference runtime is LiteRT (dev extra)")
    image = np.asarray(Image.fromarray(getattr(skimage_data, photo)()).resize((192, 192), Image.BILINEAR),
                       np.float32) / 127.5 - 1
    interpreter = litert.Interpreter(model_path=str(REFERENCE))
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], image[None])
    interpreter.invoke()
    outputs = sorted(interpreter.get_output_details(), key=lambda d: -d["shape"][-1])
    raw, logits = (interpreter.get_tensor(o["index"]) for o in outputs)
    with jax.default_matmul_precision("highest"):
        ours_raw, ours_logits = jax.jit(lambda x: device.load_face_detector()(x))(jnp.asarray(image[None]))
    ours, ours_scores = decode(ours_raw, ours_logits, 192)
    theirs, their_scores = decode(jnp.asarray(raw), jnp.asarray(logits[..., 0]), 192)
    assert float(jnp.abs(ours - theirs).max()) < 1e-4  # boxes and keypoints in units of the input
    assert float(jnp.abs(ours_logits - logits[..., 0]).max()) < 1e-4
    assert float(jnp.abs(ours_scores - their_scores).max()) < 1e-5


def test_the_weights_file_is_the_one_provenance_names_and_a_missing_one_says_how_to_make_it(tmp_path):
    assert hashlib.sha256(device.WEIGHTS.read_bytes()).hexdigest() == device.WEIGHTS_SHA256
    assert device.WEIGHTS_SHA256 in (device.WEIGHTS.parent / "PROVENANCE.md").read_text()
    with pytest.raises(FileNotFoundError, match=r"weights .*missing; make them with python tools/convert_face_det"):
        device.load_face_detector(tmp_path / "none.npz")


def test_the_astronaut_s_face_is_found_where_dlib_finds_it_and_a_wall_has_none():
    found = device.device_faces(np.stack([skimage_data.astronaut(), np.full((512, 512, 3), 128, np.uint8)]))
    assert len(found[0]) == 1 and found[1] == []
    box, score = found[0][0]
    assert score > 0.9 and _iou(box, ASTRONAUT_FACE) >= 0.6  # measured 0.67: BlazeFace's box is a little larger


def test_one_and_eight_devices_give_the_same_boxes():
    photo = skimage_data.astronaut()
    frames = np.stack([photo, photo[:, ::-1], np.roll(photo, 40, axis=1), photo[::2, ::2].repeat(2, 0).repeat(2, 1),
                       photo, photo[:, ::-1], photo, photo])
    detector = device.load_face_detector()
    size = device.detector_size(512, 512)
    one = jax.device_get(device._detect_jit(detector, jax.device_put(frames, jax.devices()[0]), size))
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()), ("batch",))
    sharded = jax.device_put(frames, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("batch")))
    eight = jax.device_get(device._detect_jit(detector, sharded, size))
    assert len(jax.devices()) == 8
    np.testing.assert_array_equal(one[2], eight[2])
    np.testing.assert_allclose(one[0][one[2]], eight[0][eight[2]], atol=1e-3)
    np.testing.assert_allclose(one[1], eight[1], atol=1e-5)


def test_the_device_crop_is_the_host_crop_up_to_resampling():
    from triskele.train.domains.deepfake.faces import ENLARGE, crop_face

    photo = skimage_data.astronaut()
    for box in (ASTRONAUT_FACE, (400, 10, 500, 110)):  # the second is clipped by the frame's edge
        host = crop_face(photo, box, 64).astype(np.float64)
        ours = device.device_crops(photo[None], [box], 64, ENLARGE)[0].astype(np.float64)
        assert np.abs(ours - host).mean() < 3.0  # measured: PIL's and JAX's antialiased filters differ
        shifted = device.device_crops(photo[None], [(box[0] + 8, box[1], box[2] + 8, box[3])], 64, ENLARGE)[0]
        assert np.abs(shifted.astype(np.float64) - host).mean() > 3 * np.abs(ours - host).mean()
