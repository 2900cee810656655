"""`python -m triskele.train --print-config`: the fully resolved config as YAML that `--config` reads
back to the same config, and the README's preset table, generated from the registry."""

import json
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from triskele.models.mars import CLASS_NAMES as MARS_CLASSES
from triskele.train.cli import main
from triskele.train.config.overrides import make_config
from triskele.train.config.presets import PRESETS
from triskele.train.config.schema import Config
from triskele.train.config.table import presets_table
from triskele.train.config.yaml_format import YamlLoader

README = Path(__file__).resolve().parents[1] / "README.md"


def printed(capsys, *argv: str) -> str:
    code = main([*argv, "--print-config"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def flat(data: dict, prefix: str = "") -> dict:
    items = {}
    for key, value in data.items():
        if isinstance(value, dict):
            items.update(flat(value, f"{prefix}{key}."))
        else:
            items[prefix + key] = value
    return items


def round_trip(capsys, tmp_path: Path, preset: str, *flags: str) -> tuple[str, dict]:
    """Prints, writes the print to a file, reads it back with --config: the same config, the same print."""
    first = printed(capsys, "--preset", preset, *flags)
    path = tmp_path / "resolved.yaml"
    path.write_text(first)
    assert printed(capsys, "--preset", preset, "--config", str(path)) == first
    assert printed(capsys, "--config", str(path)) == first  # every key is in the file: no preset needed
    written = yaml.load(first, Loader=YamlLoader)
    assert make_config(preset, files=[path]).to_dict() == written
    assert yaml.safe_load(first) == written  # a YAML 1.1 reader gets the same values
    return first, written


@pytest.mark.parametrize("preset", list(PRESETS))
def test_every_preset_round_trips(preset, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text, written = round_trip(capsys, tmp_path, preset, "--workdir", str(tmp_path / "run"))
    assert text.startswith(f"# triskele config, preset {preset},")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["resolved.yaml"]  # no workdir, no runs/
    domain = preset.split("-")[0]
    # Every key of the typed config, and the preset's own values in it.
    assert set(flat(written)) == set(flat(Config(domain=domain, options=written_options(domain)).to_dict()))
    for key, value in flat(dict(PRESETS[preset])).items():
        assert flat(written)[key] == value, key
    # What a run resolves from its data when it starts (without a mesh).
    model = written["model"]
    assert model["norm_eps"] == 1e-6
    assert written["mesh"] == ""
    if domain == "mars":
        assert model["class_names"] == list(MARS_CLASSES) == ["soil", "bedrock", "sand", "big_rock"]
        assert written["mars"]["scale"] == 1.0
        assert written["mars"]["frame_size"] == round(model["image_size"] * 1.5)
    elif domain == "merch":
        shelf = written["merch"]["task"] == "shelf"
        assert model["class_names"] == (["facing"] if shelf else [f"sku{i}" for i in range(100)] + ["empty"])
    else:
        assert model["class_names"] == ["real", "fake"]


def written_options(domain: str):
    from triskele.train.domains import get_domain

    return get_domain(domain).options()


def test_values_yaml_1_1_would_mangle_survive(capsys, tmp_path):
    names = ["off", "yes", "1e-3", "12", "null", "2024-01-01", "20:25", "big rock", "x: y", "a,b", "", "y", "éclair"]
    flags = ["--set", "run.profile_steps=20:25", "--set", "run.compilation_cache=off",
             "--set", "model.class_names=" + yaml.safe_dump(names, default_flow_style=True).strip(),
             "--set", "optim.lr=1e-3", "--set", "optim.eps=1.5e-9", "--steps", "40", "--mesh", "auto"]
    text, written = round_trip(capsys, tmp_path, "merch-tiny", *flags)
    assert written["run"]["profile_steps"] == "20:25" and written["run"]["compilation_cache"] == "off"
    assert written["model"]["class_names"] == names  # given: not read from the data
    assert written["optim"]["lr"] == 1e-3 and written["optim"]["eps"] == 1.5e-9
    assert written["run"]["steps"] == 40 and written["mesh"] == "auto"  # auto stays for the devices to resolve
    assert "profile_steps: '20:25'" in text and "compilation_cache: 'off'" in text
    # The positive control: unquoted, a YAML 1.1 reader turns them into other things.
    assert yaml.safe_load("profile_steps: 20:25\ncompilation_cache: off") == {"profile_steps": 1225,
                                                                              "compilation_cache": False}


def test_resolved_from_data_and_errors_as_in_a_run(capsys, tmp_path):
    (tmp_path / "msl").mkdir()  # AI4Mars' layout: its frames are halved
    written = yaml.load(printed(capsys, "--preset", "mars-s16", "--data", str(tmp_path)), Loader=YamlLoader)
    assert written["mars"] == {"label_agreement": 3, "scale": 0.5, "frame_size": 336}
    assert written["data"]["path"] == str(tmp_path)
    assert main(["--preset", "deepfake-tiny", "--set", "deepfake.holdout=Nope", "--print-config"]) == 2
    assert "deepfake.holdout" in capsys.readouterr().err
    assert main(["--preset", "merch-tiny", "--data", str(tmp_path / "absent"), "--print-config"]) == 2
    assert "error:" in capsys.readouterr().err


def readme_presets() -> str:
    found = re.search(r"<!-- presets:[^\n]*-->\n(.*?)<!-- /presets -->", README.read_text(), re.S)
    assert found, "README.md has no generated preset table (<!-- presets: ... --> ... <!-- /presets -->)"
    return found.group(1)


def test_readme_preset_table_is_the_registry():
    assert readme_presets() == presets_table(), "regenerate: python -c 'from triskele.train.config.table import " \
                                                "presets_table; print(presets_table())'"


def test_preset_table_states_what_each_preset_sets():
    lines = presets_table().splitlines()
    header = [cell.strip().strip("`") for cell in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = dict(zip(header[1:], cells[1:], strict=True))
    assert list(rows) == list(PRESETS)  # each preset once, nothing that is not one
    shared = dict(re.findall(r"`([\w.]+)=([^`]*)`", lines[-1])) if lines[-1].startswith("Every preset") else {}
    for name, cells in rows.items():
        values = flat(make_config(name).to_dict())
        for key in {k for preset in PRESETS.values() for k in flat(dict(preset))}:
            cell = cells.get(key, shared.get(key))
            assert cell is not None, f"{key} is set by a preset but not in the table"
            expected = "" if key not in values else str(values[key])
            assert cell == expected, (name, key)


# --- a config file sets what it holds (the fuzz test only checks the error type) ---

FILE_VALUES = {  # key -> the values a file may set it to, and what the config then holds
    "optim.lr": st.floats(1e-7, 1.0),
    "run.steps": st.integers(1, 10**6),
    "data.global_batch": st.integers(1, 4096),
    "checkpoint.keep": st.integers(1, 20),
    "checkpoint.best_metric": st.sampled_from(["top1", "map", "eval_loss"]),
    "model.remat": st.sampled_from(["none", "dots", "full"]),
    "precision": st.sampled_from(["auto", "float32", "bfloat16", "fp8"]),
    "mesh": st.sampled_from(["", "data=8", "fsdp=4,tensor=2"]),
    "merch.num_skus": st.integers(2, 500),
    "model.class_names": st.lists(st.text("abcxyz_", min_size=1, max_size=6), min_size=1, max_size=4),
}


def nested(values: dict) -> dict:
    out: dict = {}
    for key, value in values.items():
        *sections, field = key.split(".")
        node = out
        for section in sections:
            node = node.setdefault(section, {})
        node[field] = value
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.fixed_dictionaries({}, optional=FILE_VALUES), st.sampled_from([".yaml", ".json"]), st.booleans())
def test_a_config_file_sets_every_key_it_holds(tmp_path, values, suffix, dotted):
    data = values if dotted else nested(values)
    path = tmp_path / f"given{suffix}"
    path.write_text(json.dumps(data) if suffix == ".json" else yaml.safe_dump(data))
    got = flat(make_config("merch-tiny", files=[path]).to_dict())
    untouched = flat(make_config("merch-tiny").to_dict())
    for key, value in got.items():
        assert value == values.get(key, untouched[key]), key


def test_later_files_win_over_earlier_ones_and_overrides_over_files(tmp_path):
    first, second = tmp_path / "first.yaml", tmp_path / "second.json"
    first.write_text("optim:\n  lr: 0.004\nrun.steps: 7\nmodel.remat: full\n")
    second.write_text('{"optim.lr": 0.006, "checkpoint": {"keep": 9}}')
    config = make_config("mars-tiny", files=[first, second])
    assert (config.optim.lr, config.run.steps, config.model.remat, config.checkpoint.keep) == (0.006, 7, "full", 9)
    config = make_config("mars-tiny", files=[second, first])
    assert (config.optim.lr, config.checkpoint.keep) == (0.004, 9)
    config = make_config("mars-tiny", ["run.steps=11"], files=[first, second])
    assert (config.optim.lr, config.run.steps) == (0.006, 11)
    preset = make_config("mars-tiny")  # none of the files' values is the preset's
    assert (preset.optim.lr, preset.run.steps, preset.model.remat, preset.checkpoint.keep) == (0.002, 600, "dots", 2)
