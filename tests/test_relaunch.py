"""A relaunch with a changed config: refused before anything is restored, moved or written when the
change sets shapes, state dtypes or the data order; allowed otherwise."""

import hashlib
import json
from pathlib import Path

import jax
import pytest
from trainutil import SMALL, mesh_of, step_records
from triskele.train.checkpoints.resume_check import changed_keys
from triskele.train.cli import main
from triskele.train.config.overrides import make_config
from triskele.train.domains import resolve_from_data
from triskele.train.run import prepare

RUN = {**SMALL, "model.depth": 2, "checkpoint.every": 2, "checkpoint.keep": 2}


def command(workdir: Path, steps: int, **extra) -> list[str]:
    flags = {**RUN, **extra}
    return ["--workdir", str(workdir), "--steps", str(steps), "--no-progress",
            *[arg for key, value in flags.items() for arg in ("--set", f"{key}={value}")]]


def snapshot(workdir: Path) -> dict[str, str]:
    """Every file under the workdir (the lock aside) by its path, with its bytes' digest."""
    return {p.relative_to(workdir).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(workdir.rglob("*")) if p.is_file() and not p.name.endswith(".lock")}


def test_a_relaunch_that_changes_the_depth_exits_2_and_the_original_command_resumes(tmp_path, capsys):
    assert main(command(tmp_path, 4)) == 0
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["2", "4"]
    before = snapshot(tmp_path)
    capsys.readouterr()

    assert main(command(tmp_path, 6, **{"model.depth": 4})) == 2
    err = capsys.readouterr().err
    assert "model.depth: saved 2, now 4" in err and "--set model.depth=2" in err and "new --workdir" in err
    assert "--init-from" in err and "export-weights" in err
    assert snapshot(tmp_path) == before, "nothing under the workdir was moved, rewritten or added"
    assert json.loads((tmp_path / "config.json").read_text())["model"]["depth"] == 2

    assert main(command(tmp_path, 6)) == 0
    assert "completed: step 6 of 6" in capsys.readouterr().out
    assert sorted(step_records(tmp_path)) == [1, 2, 3, 4, 5, 6], "resumed at step 5, not from the start"
    assert not [p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith("corrupt")]


def resolved(preset: str, **overrides):
    config = make_config(preset, overrides)
    resolve_from_data(config)
    return config


@pytest.mark.parametrize("preset, key, value", [
    ("mars-tiny", "model.depth", 4), ("mars-tiny", "model.image_size", 32), ("mars-tiny", "pipeline.repeats", 2),
    ("mars-tiny", "data.global_batch", 16), ("mars-tiny", "data.train_size", 100), ("mars-tiny", "run.seed", 1),
    ("mars-tiny", "data.path", "/data/ai4mars"), ("mars-tiny", "data.val_fraction", 0.2),
    ("mars-tiny", "model.quantization", "int8"),
    ("merch-tiny", "merch.num_skus", 50), ("deepfake-tiny", "deepfake.frames_per_video", 4),
])
def test_keys_that_set_shapes_dtypes_or_the_data_order_are_named(preset, key, value):
    saved = resolved(preset).to_dict()
    changes = changed_keys(saved, resolved(preset, **{key: value}))
    assert key in [name for name, _, _ in changes]
    if key == "merch.num_skus":  # the class count follows it
        assert [name for name, _, _ in changes] == ["model.class_names", "merch.num_skus"]


@pytest.mark.parametrize("key, value", [
    ("run.steps", 9000), ("run.log_every", 3), ("run.eval_every", 7), ("checkpoint.every", 5),
    ("checkpoint.keep", 5), ("mesh", "data=2,fsdp=4"), ("dcn", "data=2"), ("data.threads", 1), ("data.prefetch", 1),
    ("data.workers", 2), ("data.bad_records", "skip"), ("run.profile_steps", "2:3"), ("run.compilation_cache", "off"),
    ("optim.grad_accum", 4), ("optim.lr", 0.1), ("precision", "bfloat16"), ("model.remat", "full"),
    ("pipeline.microbatches", 8), ("model.init_from", "/weights/vit.safetensors"),
])
def test_keys_that_may_change_on_resume_are_allowed(key, value):
    assert changed_keys(resolved("mars-tiny").to_dict(), resolved("mars-tiny", **{key: value})) == []


def state_layout(**overrides) -> list[tuple[str, tuple[int, ...], str]]:
    state = prepare(make_config("mars-tiny", {**SMALL, **overrides}), mesh_of("single")).abstract_state()
    return [(jax.tree_util.keystr(path), leaf.shape, str(leaf.dtype))
            for path, leaf in jax.tree_util.tree_leaves_with_path(state)]


@pytest.mark.parametrize("key, value", [
    ("precision", "bfloat16"), ("precision", "fp8"), ("optim.grad_accum", 4), ("optim.weight_decay", 0.0),
    ("optim.clip_norm", 0.5), ("model.remat", "full"), ("run.on_nonfinite", "skip"),
])
def test_the_allowed_keys_that_touch_the_step_leave_the_state_layout_alone(key, value):
    """Why they are allowed: the checkpoint's state (tree, shapes, dtypes) is the same under them."""
    assert state_layout(**{key: value}) == state_layout()


def test_state_layout_control_a_fixed_key_changes_it():
    assert state_layout(**{"model.depth": 4}) != state_layout()


@pytest.mark.parametrize("preset, key, value", [("mars-tiny", "mars.label_agreement", 1),
                                                ("deepfake-tiny", "deepfake.eval_methods", "Sharpen")])
def test_a_domains_evaluation_only_options_may_change_on_resume(preset, key, value):
    assert changed_keys(resolved(preset).to_dict(), resolved(preset, **{key: value})) == []
