"""The dense facing detector's targets, loss and decoding: peaks at box centres, padded
boxes that change nothing, the same targets on one device and on eight, boxes drawn by hand that
decode back, and the detector's forward pass the same on a sharded mesh as on one device."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_trees_close
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec
from triskele.mesh import make_mesh, tree_shardings
from triskele.models import ViTConfig, centernet
from triskele.models.merch import FacingDetector

STRIDE, GRID = 4, (16, 24)  # a 64 x 96 image
BOXES = np.array([[4, 6, 20, 30], [22, 6, 30, 30], [40.5, 8, 90, 60], [3, 40, 13, 62]], np.float32)


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise IoU of (N, 4) boxes a and b."""
    lo, hi = np.maximum(a[:, :2], b[:, :2]), np.minimum(a[:, 2:], b[:, 2:])
    inter = np.prod(np.clip(hi - lo, 0, None), axis=1)
    area = lambda x: np.prod(x[:, 2:] - x[:, :2], axis=1)
    return inter / (area(a) + area(b) - inter)


def padded(boxes: np.ndarray, total: int, junk: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """boxes padded to `total` rows (random boxes when `junk`, zeros otherwise), and their valid mask."""
    pad = total - len(boxes)
    filler = np.random.default_rng(0).uniform(0, 60, (pad, 4)).astype(np.float32) if junk else np.zeros((pad, 4))
    filler = np.sort(filler.reshape(pad, 2, 2), axis=1).reshape(pad, 4) if junk else filler
    return np.concatenate([boxes, filler]).astype(np.float32), np.r_[np.ones(len(boxes)), np.zeros(pad)]


def test_each_boxs_heatmap_peak_sits_at_its_centre_cell():
    boxes, valid = padded(BOXES, 8)
    t = jax.tree.map(np.asarray, centernet.targets(boxes[None], valid[None], STRIDE, GRID))
    heat = t["heatmap"][0]
    for x1, y1, x2, y2 in BOXES:
        cx, cy = int((x1 + x2) / 2 / STRIDE), int((y1 + y2) / 2 / STRIDE)
        assert heat[cy, cx] == 1.0 and t["centre"][0, cy, cx] == 1.0
        assert heat[cy, cx + 1] < 1 and heat[cy + 1, cx] < 1  # falling off around it
        np.testing.assert_allclose(t["offset"][0, cy, cx], [(x1 + x2) / 2 / STRIDE - cx, (y1 + y2) / 2 / STRIDE - cy],
                                   atol=1e-6)
        np.testing.assert_allclose(np.exp(t["log_size"][0, cy, cx]), [(x2 - x1) / STRIDE, (y2 - y1) / STRIDE],
                                   rtol=1e-6)
    assert t["centre"].sum() == len(BOXES) and heat.max() == 1.0 and (heat == 1.0).sum() == len(BOXES)
    # The spread follows the box: the tall narrow box 2 (8 x 24 px) falls off faster across than down.
    cx, cy = 6, 4
    assert heat[cy, cx + 1] < heat[cy + 1, cx]
    # By hand: sigma = 0.54 * size / 6 in cells; box 1's neighbour one cell right.
    sigma_x = 0.54 * (16 / STRIDE) / 6
    assert t["heatmap"][0, 4, 4] == pytest.approx(np.exp(-1 / (2 * sigma_x**2)), rel=1e-5)


def test_padded_boxes_change_no_target():
    clean = centernet.targets(*(a[None] for a in padded(BOXES, 300)), STRIDE, GRID)
    junk = centernet.targets(*(a[None] for a in padded(BOXES, 300, junk=True)), STRIDE, GRID)
    exact = centernet.targets(BOXES[None], np.ones((1, 4)), STRIDE, GRID)
    for key in clean:
        np.testing.assert_array_equal(np.asarray(junk[key]), np.asarray(clean[key]), err_msg=key)
        np.testing.assert_array_equal(np.asarray(exact[key]), np.asarray(clean[key]), err_msg=key)


def test_two_boxes_on_one_centre_cell_keep_the_later_one():
    boxes = np.array([[8, 8, 24, 24], [9, 9, 23, 25]], np.float32)  # both centred in cell (4, 4)
    t = centernet.targets(boxes[None], np.ones((1, 2)), STRIDE, GRID)
    np.testing.assert_allclose(np.exp(np.asarray(t["log_size"])[0, 4, 4]), [14 / 4, 16 / 4], rtol=1e-6)
    assert float(t["centre"].sum()) == 1


def test_each_boxs_label_is_placed_at_its_centre_cell_the_later_box_winning():
    boxes = np.array([[8, 8, 24, 24], [9, 9, 23, 25], [40, 8, 60, 40], [0, 0, 0, 0]], np.float32)
    labels = np.array([[3, 7, -1, 5]], np.int32)  # box 2 foreign, box 3 padding
    t = centernet.targets(boxes[None], np.array([[1, 1, 1, 0]], np.float32), STRIDE, GRID, labels)
    label = np.asarray(t["label"])[0]
    assert label.dtype == np.int32 and label[4, 4] == 7  # box 1 takes the cell it shares with box 0
    assert label[3, 12] == -1 and label[0, 0] == -1  # the foreign box's centre; the padded box trains nothing
    assert (label >= 0).sum() == 1
    assert set(t) == {"heatmap", "centre", "offset", "log_size", "label"}


def test_targets_are_the_same_on_one_device_and_on_eight(devices):
    rng = np.random.default_rng(1)
    lo = rng.uniform(0, 80, (8, 64, 2))
    boxes = np.concatenate([lo, lo + rng.uniform(2, 30, (8, 64, 2))], -1).astype(np.float32)
    valid = (rng.uniform(size=(8, 64)) < 0.7).astype(np.float32)
    one = jax.jit(lambda b, v: centernet.targets(b, v, STRIDE, GRID))(boxes, valid)
    mesh = make_mesh("data=8")
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    eight = jax.jit(lambda b, v: centernet.targets(b, v, STRIDE, GRID))(jax.device_put(boxes, sharding),
                                                                      jax.device_put(valid, sharding))
    assert eight["heatmap"].sharding.spec[0] == "data"
    for key in one:
        np.testing.assert_array_equal(np.asarray(eight[key]), np.asarray(one[key]), err_msg=key)


def perfect_outputs(boxes: np.ndarray) -> dict[str, jax.Array]:
    """The maps a perfect detector would give: its logits the targets' (the heatmap's logit)."""
    t = centernet.targets(boxes[None], np.ones((1, len(boxes))), STRIDE, GRID)
    heat = jnp.clip(t["heatmap"], 1e-4, 1 - 1e-4)
    return {"heatmap": jnp.log(heat / (1 - heat)), "offset": t["offset"], "log_size": t["log_size"]}


def test_boxes_drawn_by_hand_decode_back():
    boxes, scores, _ = centernet.decode(perfect_outputs(BOXES), STRIDE, k=10)
    boxes, scores = np.asarray(boxes)[0], np.asarray(scores)[0]
    assert boxes.shape == (10, 4) and np.all(np.diff(scores) <= 0)
    found = boxes[scores > 0.5]
    assert len(found) == len(BOXES)
    best = np.array([found[np.argmax(iou(np.repeat(b[None], len(found), 0), found))] for b in BOXES])
    assert iou(best, BOXES).min() > 0.99
    assert scores[len(BOXES)] < 0.5  # no fifth peak above the threshold: the Gaussians' shoulders are no peaks


def test_fast_nms_zeroes_a_box_a_higher_one_overlaps_and_keeps_its_neighbours():
    """Sorted best first: box 1 overlaps box 0 by IoU 9/11, box 3 overlaps box 0 by 8/12 (and box 1,
    itself suppressed, by 9/11: a suppressed box still suppresses); box 2 touches no other."""
    boxes = jnp.array([[[0, 0, 10, 10], [1, 0, 11, 10], [20, 0, 30, 10], [2, 0, 12, 10]]], jnp.float32)
    scores = jnp.array([[0.9, 0.8, 0.7, 0.6]])
    np.testing.assert_allclose(centernet.fast_nms(boxes, scores, 0.5), [[0.9, 0.0, 0.7, 0.0]])
    np.testing.assert_allclose(centernet.fast_nms(boxes, scores, 0.85), scores)  # none above 0.85


def test_a_facing_that_peaks_twice_decodes_once():
    """Two peaks two cells apart on one wide box (a heatmap's ridge can do that): the lower one's
    box overlaps the higher one's by IoU 8/12, so it comes back scored 0, the rest best first."""
    heat = np.full((1, *GRID), -9.0, np.float32)
    heat[0, 4, 4], heat[0, 4, 6], heat[0, 10, 10] = 3.0, 2.0, 1.0
    log_size = np.zeros((1, *GRID, 2), np.float32)
    log_size[0, 4, 4] = log_size[0, 4, 6] = np.log([10.0, 4.0])  # 10 x 4 cells, 2 cells apart
    outputs = {"heatmap": jnp.asarray(heat), "offset": jnp.zeros((1, *GRID, 2)), "log_size": jnp.asarray(log_size)}
    boxes, scores, cells = centernet.decode(outputs, STRIDE, k=3)
    expected = jax.nn.sigmoid(jnp.array([3.0, 1.0]))
    np.testing.assert_allclose(np.asarray(scores)[0, :2], expected, rtol=1e-6)
    assert float(scores[0, 2]) == 0.0 and list(np.asarray(cells)[0]) == [4 * GRID[1] + 4, 10 * GRID[1] + 10,
                                                                        4 * GRID[1] + 6]
    np.testing.assert_allclose(np.asarray(boxes)[0, 0], np.array([4 - 5, 4 - 2, 4 + 5, 4 + 2]) * STRIDE, atol=1e-5)


def test_the_loss_of_the_perfect_maps_is_lowest():
    boxes, valid = padded(BOXES, 16)
    target = centernet.targets(boxes[None], valid[None], STRIDE, GRID)
    perfect = perfect_outputs(BOXES)
    worse = {**perfect, "offset": perfect["offset"] + 0.3}
    flat = {k: jnp.zeros_like(v) for k, v in perfect.items()}
    losses = [float(centernet.detection_loss(o, target)[0]) for o in (perfect, worse, flat)]
    assert losses[0] < losses[1] < losses[2]
    # The offset term by hand: 0.3 on both axes at each of the 4 centres, weight 1.
    assert losses[1] - losses[0] == pytest.approx(4 * 2 * 0.3, rel=1e-4)


TINY = ViTConfig(width=32, depth=2, mlp_dim=64, heads=2, patch=8, image_size=32)


def detector_outputs(mesh) -> dict[str, np.ndarray]:
    abstract = nnx.eval_shape(lambda: FacingDetector(TINY, max_detections=20, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract, nnx.Param)
    init = lambda: nnx.to_pure_dict(nnx.state(FacingDetector(TINY, max_detections=20, rngs=nnx.Rngs(0)), nnx.Param))
    params = jax.jit(init, out_shardings=tree_shardings(state, mesh))()
    images = jax.random.uniform(jax.random.key(2), (8, 32, 32, 3))
    boxes, valid = padded(BOXES / 3, 32)
    batch = {"image": images, "boxes": jnp.tile(boxes[None], (8, 1, 1)), "box_valid": jnp.tile(valid[None], (8, 1)),
             "valid": jnp.ones(8)}

    def run(p):
        model = nnx.merge(graphdef, p)
        loss, weight = model.loss_terms(batch)
        return model(images), model.infer(images), loss / weight

    with jax.set_mesh(mesh):
        return jax.device_get(jax.jit(run)(params))


# One mesh that splits the batch, the embed (fsdp) and the MLP (tensor) at once; tests/test_shelf_detector.py
# trains the detector on data=8 and data=2,fsdp=2,tensor=2 against one device.
@pytest.mark.parametrize("spec", ["data=2,fsdp=2,tensor=2"])
def test_the_detector_gives_the_same_maps_and_loss_on_a_sharded_mesh(spec, devices):
    reference = detector_outputs(make_mesh("data=1", devices=devices[:1]))
    maps, served, loss = reference
    assert maps["heatmap"].shape == (8, 8, 8) and maps["offset"].shape == (8, 8, 8, 2)
    assert served["boxes"].shape == (8, 20, 4) and np.isfinite(loss)
    # At initialisation every cell scores the prior, 0.1 (zero weights, the prior's logit as bias).
    np.testing.assert_allclose(jax.nn.sigmoid(maps["heatmap"]), centernet.PRIOR, rtol=1e-5)
    assert_trees_close(detector_outputs(make_mesh(spec)), reference, 1e-5)
