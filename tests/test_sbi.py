"""Self-blended training (deepfake.fakes=sbi), the unseen families and the cross-manipulation table."""

import json

import numpy as np
import pytest
from scipy import ndimage
from sklearn.metrics import roc_auc_score
from test_deepfake_data import write_ffpp
from triskele.train import make_config
from triskele.train.data.pipeline import TrainStepLoader
from triskele.train.domains import get_domain
from triskele.train.domains.deepfake.data import FAMILY_NAMES, UNSEEN_FAMILIES, SyntheticFaces
from triskele.train.domains.deepfake.faces import crop_face_region
from triskele.train.domains.deepfake.metrics import metrics
from triskele.train.domains.deepfake.sbi import (
    POOL_FAMILY,
    blend_boundary,
    blend_mask,
    draw,
    pool_without,
    post_augment,
)


def _sbi_source(image_size: int | None = 32, **options):
    """The self-blended training split of the tiny preset (its 64-px faces when `image_size` is None)."""
    small = {"model.image_size": image_size, "data.train_size": 64, "deepfake.frames_per_video": 4}
    config = make_config("deepfake-tiny", {**(small if image_size else {"data.train_size": 2000}),
                                           "deepfake.fakes": "sbi",
                                           **{f"deepfake.{k}": v for k, v in options.items()}})
    get_domain("deepfake").resolve(config)
    return get_domain("deepfake").open_split(config, "train")


def test_blend_mask_is_a_soft_mask_inside_the_face_box():
    region = SyntheticFaces("train", 8, 64, 4).real_face(1)[1]
    rows, cols = np.nonzero(region > 0.5)
    outside = np.ones_like(region, bool)
    outside[rows.min():rows.max() + 1, cols.min():cols.max() + 1] = False
    ratios = set()
    for seed in range(40):
        chosen = draw(pool_without(None), np.random.default_rng(seed))
        mask = blend_mask(region, chosen)
        assert mask.min() >= 0 and mask.max() <= 1
        assert np.all(mask[outside] == 0)
        assert mask.max() == pytest.approx(chosen.ratio)
        assert ((mask > 0.05 * chosen.ratio) & (mask < 0.95 * chosen.ratio)).sum() > 20  # a blurred edge
        ratios.add(chosen.ratio)
    assert ratios == {0.25, 0.5, 0.75, 1.0}
    ellipse = crop_face_region(65)
    assert ellipse[32, 32] == 1 and ellipse[32, 4] == 0
    assert ellipse.mean() == pytest.approx(np.pi / 4 / 1.3**2, abs=0.01)


def test_fake_twin_differs_from_its_real_only_inside_the_mask():
    source = _sbi_source()
    assert len(source) == 2 * source.reals.num_reals == 64
    for pair in range(6):
        rng = np.random.default_rng([0, 2, 2 * pair])
        real, zero, video, chosen = source.twin(2 * pair, rng)
        fake, mask, video_b, chosen_b = source.twin(2 * pair + 1, np.random.default_rng([0, 2, 2 * pair + 1]))
        assert chosen == chosen_b and video == video_b and not zero.any()
        assert real.shape == fake.shape == (32, 32, 3)
        np.testing.assert_array_equal(fake[mask == 0], real[mask == 0])
        assert np.abs(fake - real)[mask > 0.5 * mask.max()].mean() > 0.005
    records = [source.load(i, np.random.default_rng([0, 0, i])) for i in range(4)]
    assert [int(r["label"]) for r in records] == [0, 1, 0, 1]
    assert [int(r["family"]) for r in records] == [0, 1, 0, 1]
    assert records[0]["blend"].max() == 0 and records[1]["blend"].max() > 0


def _high_frequency_energy(image: np.ndarray, where: np.ndarray) -> float:
    grey = image.mean(-1)
    return float(((grey - ndimage.gaussian_filter(grey, 1.0))[where] ** 2).mean())


@pytest.mark.slow
@pytest.mark.parametrize("holdout", [None, "Sharpen"])
def test_a_fake_twin_is_no_smoother_than_its_real_more_often_than_chance(holdout):
    """With the reference's sub-pixel affine on the fake alone, the fake's inner face was
    smoother than its own real's in 61% of the preset's training pairs, and a detector learned
    "smoother means fake". Over 1,000 pairs of 64-px faces, captured and post-augmented as training
    reads them (without the flip), it must be 0.45-0.55 (measured: 0.546; with holdout=Sharpen 0.482)."""
    source = _sbi_source(None, **({"holdout": holdout} if holdout else {}))
    smoother = []
    for pair in range(1000):
        rng = np.random.default_rng([0, 0, 2 * pair])
        images = []
        for index in (2 * pair, 2 * pair + 1):
            frames, mask, _, _ = source.twin(index, rng)
            images.append(post_augment(source.reals.capture(pair, frames), source._pair_generator(index, rng, 37)))
        where = mask > 0.5 * mask.max()
        smoother.append(_high_frequency_energy(images[1], where) < _high_frequency_energy(images[0], where))
    assert 0.45 <= np.mean(smoother) <= 0.55, np.mean(smoother)


def test_the_patch_target_is_the_blend_boundary_and_the_twins_are_compressed_alike():
    source = _sbi_source(None)  # 64-px faces: JPEG's 16x16 colour blocks do not all meet the mask
    rng = np.random.default_rng([0, 0, 6])
    real, _, _, _ = source.twin(6, rng)
    fake, mask, _, chosen = source.twin(7, rng)
    boundary = blend_boundary(mask, chosen.ratio)
    assert boundary.max() > 0.9 and np.all(boundary[mask == 0] == 0)
    assert np.all(boundary[np.isclose(mask, chosen.ratio)] < 1e-4)  # fully blended: inside, no boundary
    np.testing.assert_array_equal(source.reals.capture(3, real), source.reals.capture(3, real))
    differs = np.abs(source.reals.capture(3, fake) - source.reals.capture(3, real)).max(-1) > 0
    touched = (mask > 0).reshape(4, 16, 4, 16).any(axis=(1, 3))  # the 16x16 blocks (4:2:0) the blend meets
    assert differs.any() and not touched.all()
    near = ndimage.binary_dilation(np.kron(touched, np.ones((16, 16))) > 0, iterations=2)  # decoding's chroma
    assert not differs[~near].any()  # upsampling reaches a pixel or two into the next block
    record = source.load(7, rng)
    assert record["blend"].max() > 0.9 * 255


def test_records_are_deterministic_per_epoch_and_identical_on_any_process_count():
    source = _sbi_source()
    again = _sbi_source()
    whole = TrainStepLoader(source, 8, seed=0, rows=(0, 8))
    halves = [TrainStepLoader(again, 8, seed=0, rows=rows) for rows in ((0, 4), (4, 8))]
    for step in (0, 9):  # step 9 is in the second epoch
        one = whole(step)
        two = [loader(step) for loader in halves]
        for key in ("image", "label", "blend", "family"):
            np.testing.assert_array_equal(one[key], np.concatenate([two[0][key], two[1][key]]), err_msg=key)
    epoch0 = source.pair_draw(3, np.random.default_rng([0, 0, 3]))
    epoch1 = source.pair_draw(3, np.random.default_rng([0, 1, 3]))
    assert epoch0 != epoch1 and epoch0 == source.pair_draw(2, np.random.default_rng([0, 0, 2]))


def _applied(source) -> list[str]:
    """The pool transforms of 200 fake twins' draws."""
    return [t for i in range(1, 400, 2) for t in source.pair_draw(i, np.random.default_rng([0, 0, i])).transforms]


def test_holdout_removes_the_familys_transforms_from_the_pool():
    assert {POOL_FAMILY[t] for t in pool_without(None)} == {"ColorShift", "Exposure", "Resample", "Sharpen"}
    for holdout in ("Sharpen", "ColorShift"):
        source = _sbi_source(holdout=holdout)
        applied = _applied(source)
        assert applied and not any(POOL_FAMILY[t] == holdout for t in applied)
    assert set(_applied(_sbi_source())) == set(POOL_FAMILY)


def test_sbi_video_twins_keep_one_blend_with_flicker():
    config = make_config("deepfake-tiny", {"model.image_size": 32, "data.train_size": 8, "model.frames": 4,
                                           "deepfake.frames_per_video": 4, "deepfake.fakes": "sbi"})
    source = get_domain("deepfake").open_split(config, "train")
    fake, mask, _, _ = source.twin(1, np.random.default_rng([0, 0, 1]))
    assert fake.shape == (4, 32, 32, 3) and mask.shape == (4, 32, 32)
    peaks = mask.reshape(4, -1).max(axis=1)
    assert len(set(np.round(peaks, 6))) > 1 or peaks.max() == 1  # flicker (or a ratio clipped at 1)
    overlap = [((mask[0] > 0.5) == (mask[t] > 0.5)).mean() for t in range(1, 4)]
    assert min(overlap) > 0.9  # one blend region, following the face


def test_unseen_families_are_in_the_test_split_only():
    test = SyntheticFaces("test", 400, 32, 2)
    assert {test.family(v) for v in range(1, test.num_videos, 2)} >= set(UNSEEN_FAMILIES)
    only = SyntheticFaces("test", 40, 32, 2, families=("Warp",))
    records = [only.load(i) for i in range(len(only))]
    fakes = [r for r in records if r["label"] == 1]
    assert {int(r["family"]) for r in fakes} == {FAMILY_NAMES.index("Warp")}
    assert all(r["blend"].max() > 0 for r in fakes) and all(int(r["family"]) == 0 for r in records if r["label"] == 0)
    with pytest.raises(ValueError, match="Swap and Warp are in the test split only"):
        SyntheticFaces("train", 40, 32, 2, families=("Swap",))


def test_family_aucs_equal_scikit_learn_and_cover_every_family():
    rng = np.random.default_rng(0)
    family = rng.integers(0, 4, size=300)
    label = (family > 0).astype(int)
    score = rng.random(300) * 0.6 + 0.4 * (family == 2) + 0.1 * label
    video = np.arange(300) // 3
    totals = {"label": label, "score": score, "video": video, "family": family,
              "family_names": np.array(["real", "A", "B", "C"])}
    result = metrics(totals)
    for code, name in enumerate(["A", "B", "C"], start=1):
        chosen = (family == 0) | (family == code)
        assert result[f"auc_frame/{name}"] == pytest.approx(roc_auc_score(label[chosen], score[chosen]), abs=1e-12)
        assert 0 <= result[f"auc_video/{name}"] <= 1
    assert result["auc_frame/B"] > result["auc_frame/A"]


def test_sbi_on_disk_reads_reals_only_and_reports_each_method(tmp_path):
    write_ffpp(tmp_path)
    config = make_config("deepfake-tiny", {"model.image_size": 16, "data.path": str(tmp_path),
                                           "deepfake.frames_per_video": 3, "deepfake.fakes": "sbi"})
    train = get_domain("deepfake").open_split(config, "train")
    assert train.reals.video_names == ["original/000", "original/001"] and len(train) == 12
    fake, mask, _, _ = train.twin(1, np.random.default_rng(0))
    assert mask.max() > 0 and np.all(mask[0] == 0) and np.all(mask[:, 0] == 0)
    test = get_domain("deepfake").open_split(config, "test")
    assert test.family_names == ("real", "Deepfakes", "FaceSwap")
    assert [int(test.load(i)["family"]) for i in range(0, len(test), 3)] == [0, 0, 1, 1, 2, 2]


def test_unknown_recipe_or_family_is_refused():
    for key, value, message in (("fakes", "gan", "deepfake.fakes"), ("holdout", "Blur", "deepfake.holdout")):
        config = make_config("deepfake-tiny", {f"deepfake.{key}": value})
        with pytest.raises(ValueError, match=message):
            get_domain("deepfake").resolve(config)


SBI_RUN = {"model.image_size": 32, "model.patch": 4, "data.train_size": 2048, "data.eval_size": 256,
           "deepfake.frames_per_video": 4, "deepfake.fakes": "sbi", "deepfake.holdout": "Sharpen",
           "deepfake.eval_methods": "Swap,Warp", "run.steps": 480, "run.eval_every": 0, "optim.warmup_steps": 20}
SBI_RUN_BOUND = 0.53
"""Frame AUC on the families no recipe ever makes (Swap and Warp: held out of every pool) that
this small run (480 steps, 32-pixel faces, reals only, sharpening also removed from the pool) must
beat. It measured 0.561 (Swap 0.562, Warp 0.560) on a 2-core CPU with the patch head on the blend
boundary; 0.549 on the blended fraction, 0.497 without the patch loss. Before the twins were made
alike (the fake's inner face alone resampled: "smoother means fake") it measured 0.712: that
shortcut, not blending evidence, was most of what this short run had learned."""


@pytest.mark.slow
@pytest.mark.xdist_group("sbi_run")
def test_short_sbi_run_detects_held_out_families(tmp_path, devices):
    from triskele.eval.report import evaluate_checkpoint
    from triskele.mesh import make_mesh
    from triskele.train import train

    config = make_config("deepfake-tiny", SBI_RUN)
    train(config, tmp_path, progress=False, mesh=make_mesh("data=8"))
    report = evaluate_checkpoint(tmp_path, mesh="data=8")
    families = {k for k in report["metrics"] if k.startswith("auc_frame/")}
    assert families == {"auc_frame/Swap", "auc_frame/Warp"}  # eval_methods selects the families alone
    assert report["metrics"]["auc_frame"] > SBI_RUN_BOUND, json.dumps(report["metrics"])
