"""Every test runs on 8 simulated CPU devices; set before JAX is imported anywhere."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from triskele.train.bookkeeping.compile_cache import enable_compilation_cache  # noqa: E402

enable_compilation_cache()

SLOW_MODULES = frozenset({
    "test_cross_dataset", "test_deepfake_eval", "test_doc_commands", "test_domain_commands", "test_domains",
    "test_export", "test_face_crops", "test_faults", "test_gpu_script", "test_inference", "test_interrupt",
    "test_mars_eval", "test_merch", "test_multihost", "test_no_false_warnings", "test_notebook", "test_packed",
    "test_pipeline_1f1b", "test_precision", "test_pretrained", "test_quantize", "test_read_only_store",
    "test_readme_examples", "test_relaunch", "test_restore_order", "test_serve", "test_serve_drain",
    "test_serve_limits", "test_serve_shelf", "test_shelf_detector", "test_slurm", "test_training_outputs",
    "test_videos",
})
"""Modules that train models, serve them or run commands end to end. `pytest -m "not slow"`, the fast
lane, leaves them out; every behaviour they check end to end has a unit test in a fast module."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.stem in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)


def relative_error(a, b) -> float:
    """||a - b|| / ||b||, the per-array measure every equivalence test uses."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    denom = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / (denom if denom > 0 else 1.0))


def assert_trees_close(actual, expected, tol: float) -> None:
    """Per-leaf relative error below `tol`, naming the first leaf that is not.

    A leaf that is zero up to round-off in the reference (e.g. the gradient of the attention key
    bias, which softmax cancels) has no meaningful relative error: it must instead stay below
    `tol` times the largest leaf norm in absolute terms.
    """
    paths = jax.tree_util.tree_flatten_with_path(expected)[0]
    actual_leaves = jax.tree.leaves(actual)
    assert len(actual_leaves) == len(paths), "trees differ in structure"
    scale = max(float(np.linalg.norm(np.asarray(b, np.float64))) for _, b in paths)
    for (path, b), a in zip(paths, actual_leaves, strict=True):
        if np.linalg.norm(np.asarray(b, np.float64)) < 1e-6 * scale:
            diff = float(np.linalg.norm(np.asarray(a, np.float64) - np.asarray(b, np.float64)))
            assert diff < tol * scale, f"{jax.tree_util.keystr(path)}: zero leaf moved by {diff:.3g}"
            continue
        err = relative_error(a, b)
        assert err < tol, f"{jax.tree_util.keystr(path)}: relative error {err:.3g} >= {tol}"


@pytest.fixture(scope="session")
def devices():
    assert len(jax.devices()) == 8, "tests expect 8 simulated CPU devices"
    return jax.devices()


PRECISION_RUN = {"model.image_size": 32, "run.steps": 300, "run.log_every": 50, "run.eval_every": 300,
                 "data.train_size": 2048, "data.eval_size": 128}
"""mars-tiny at 32 px for 300 steps: learns to mIoU ~0.48 in ~25 s (float32, one CPU device)."""


@pytest.fixture(scope="session")
def mars_precision_runs(tmp_path_factory):
    """mars-tiny trained for 300 steps with the same seed in float32, bfloat16 and fp8:
    precision -> (workdir, summary). The float32 run is also the checkpoint that the quantization
    and export tests start from."""
    from triskele.mesh import make_mesh
    from triskele.train import make_config, train

    runs = {}
    for precision in ("float32", "bfloat16", "fp8"):
        workdir = tmp_path_factory.mktemp(f"mars-{precision}")
        config = make_config("mars-tiny", {**PRECISION_RUN, "precision": precision})
        summary = train(config, workdir, progress=False,
                        mesh=make_mesh("data=1", devices=jax.devices()[:1]))
        runs[precision] = (workdir, summary)
    return runs


DOMAIN_RUN = {"mars": ("miou", {"data.eval_size": 40}),
              "deepfake": ("auc_frame", {"data.eval_size": 64, "deepfake.frames_per_video": 4}),
              "merch": ("top1", {"data.eval_size": 300, "merch.num_skus": 20})}
"""Per domain: the metric its CLI run keeps the best checkpoint by, and its small data settings."""


@pytest.fixture(scope="session")
def domain_runs(tmp_path_factory):
    """One short command-line run per domain (6 steps, evaluated and checkpointed every 2, the best
    checkpoint kept by the domain's metric): domain -> workdir."""
    from triskele.train.cli import main

    runs = {}
    for domain, (metric, data) in DOMAIN_RUN.items():
        workdir = tmp_path_factory.mktemp(f"{domain}-cli")
        flags = {"model.image_size": 32, "data.train_size": 256, "run.log_every": 2, "run.eval_every": 2,
                 "checkpoint.every": 2, "checkpoint.keep": 1, "checkpoint.best_metric": metric,
                 "checkpoint.best_mode": "max", "optim.warmup_steps": 0, **data}
        argv = ["--preset", f"{domain}-tiny", "--workdir", str(workdir), "--steps", "6", "--no-progress"]
        assert main(argv + [arg for k, v in flags.items() for arg in ("--set", f"{k}={v}")]) == 0
        runs[domain] = workdir
    return runs


@pytest.fixture(scope="session")
def uninterrupted_run(tmp_path_factory):
    """The subprocess runs' trajectory uninterrupted, in process on one device: (per-step records,
    final parameters), what a killed, interrupted or relaunched run must end up with."""
    from subprocess_runs import CHAIN, STEPS
    from trainutil import final_params, mesh_of, small_config, step_records
    from triskele.train import train

    workdir = tmp_path_factory.mktemp("uninterrupted")
    train(small_config(**{**CHAIN, "run.steps": STEPS}), workdir, mesh=mesh_of("single"), progress=False)
    return step_records(workdir), final_params(workdir)[0]
