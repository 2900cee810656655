"""Property-based tests: any mesh spec, --set value or config file either parses or raises the
suite's own error (a ValueError with a message), never another exception."""

import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from triskele.mesh import MeshSpec
from triskele.train.config.keys import load_file, parse_override
from triskele.train.config.overrides import make_config

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
KEYS = ["mesh", "precision", "optim.lr", "optim.grad_accum", "data.global_batch", "model.remat", "model.size",
        "model.image_size", "run.steps", "run.profile_steps", "checkpoint.best_metric", "checkpoint.every", "model",
        "data.bad_records", "run.on_nonfinite", "pipeline.repeats", "nope", "optim.lr.x", "run.compilation_cache"]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                    st.text(max_size=12), st.lists(st.integers(), max_size=3),
                    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2))


def expect_own_error(call) -> None:
    try:
        call()
    except ValueError as err:
        assert str(err), "errors must say what is wrong"


@FUZZ
@given(st.text(alphabet=string.printable + "é٣-=,", max_size=40))
def test_mesh_specs(text):
    def parse_and_resolve():
        spec = MeshSpec.parse(text)
        spec.resolve(8)

    expect_own_error(parse_and_resolve)


@FUZZ
@given(st.sampled_from(KEYS), st.text(alphabet=string.printable, max_size=30))
def test_set_values(key, raw):
    expect_own_error(lambda: make_config("mars-tiny", [f"{key}={raw}"]))


@FUZZ
@given(st.text(alphabet=string.printable, max_size=40))
def test_override_strings(text):
    expect_own_error(lambda: parse_override(text))


@FUZZ
@given(st.dictionaries(st.sampled_from(KEYS), SCALARS, max_size=4))
def test_override_mappings(overrides):
    expect_own_error(lambda: make_config("deepfake-tiny", overrides))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("configs")


@FUZZ
@given(st.sampled_from([".yaml", ".json", ".txt"]), st.text(alphabet=string.printable + "äß\x00", max_size=80))
def test_config_files(folder, suffix, text):
    path = folder / f"config{suffix}"
    path.write_text(text)

    def load_and_apply():
        make_config("merch-tiny", files=[path])
        load_file(path)

    expect_own_error(load_and_apply)
