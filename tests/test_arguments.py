"""Arguments checked at the door: an existing file given where a folder goes, a count or size below
what works, a port past 65535: exit 2 naming the flag and what would work, before anything runs."""

from __future__ import annotations

import pytest
from triskele.eval.cli import main as eval_main
from triskele.train.cli import main as train_main


def refused(main, argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.fixture
def a_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("not a folder")
    return path


def test_an_existing_file_given_as_a_folder_is_refused_naming_it(a_file, tmp_path, capsys):
    cases = [
        (train_main, ["--workdir", str(a_file)], "--workdir"),
        (train_main, ["--workdir", str(a_file / "run")], "--workdir"),
        (eval_main, ["--workdir", str(a_file)], "--workdir"),
        (eval_main, ["predict", "--workdir", str(tmp_path), "--input", str(tmp_path), "--output", str(a_file)],
         "--output"),
        (eval_main, ["export", "--workdir", str(tmp_path), "--output", str(a_file / "model.jax")], "--output"),
        (train_main, ["prepare", "deepfake", "--input", str(tmp_path), "--output", str(a_file)], "--output"),
    ]
    for main, argv, flag in cases:
        err = refused(main, argv, capsys)
        assert f"argument {flag}: " in err and str(a_file) in err and "is a file" in err, (argv, err)
        assert "Traceback" not in err


@pytest.mark.parametrize("argv, message", [
    (["predict", "--batch", "0"], "argument --batch: 0 is out of range; give an integer 1 or more"),
    (["predict", "--stride", "0"], "argument --stride: 0 is out of range; give an integer 1 or more"),
    (["predict", "--prefetch", "-3"], "argument --prefetch: -3 is out of range; give an integer 1 or more"),
    (["predict", "--frames-per-video", "0"], "argument --frames-per-video: 0 is out of range"),
    (["predict", "--threads", "two"], "argument --threads: 'two' is not an integer; give an integer 1 or more"),
    (["serve", "--max-batch", "0"], "argument --max-batch: 0 is out of range; give an integer 1 or more"),
    (["serve", "--port", "65536"], "argument --port: 65536 is out of range; give an integer from 0 to 65535"),
    (["predict", "--score-threshold", "1.5"], "argument --score-threshold: 1.5 is out of range; give a number "
                                              "from 0 to 1"),
])
def test_counts_and_sizes_out_of_range_are_refused_with_the_range_that_works(argv, message, tmp_path, capsys):
    required = ["--workdir", str(tmp_path)] + (["--input", str(tmp_path), "--output", str(tmp_path / "out")]
                                               if argv[0] == "predict" else [])
    err = refused(eval_main, [argv[0], *required, *argv[1:]], capsys)
    assert message in err, err


def test_train_counts_are_checked_too(tmp_path, capsys):
    assert "argument --steps: 0 is out of range" in refused(train_main, ["--steps", "0"], capsys)
    err = refused(train_main, ["plan", "--preset", "mars-tiny", "--devices", "0"], capsys)
    assert "argument --devices: 0 is out of range; give an integer 1 or more" in err


def test_every_command_that_takes_no_progress_accepts_it(tmp_path, capsys):
    """evaluate draws no bar, but a script passing --no-progress to train, evaluate and predict alike
    reaches the command: here it says the run does not exist, not that the flag is unknown."""
    assert eval_main(["--workdir", str(tmp_path / "missing"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments" not in err and "does not exist" in err


def test_serve_s_flags_are_its_options_fields_with_their_defaults_and_ranges(capsys):
    import argparse
    import dataclasses

    from triskele.eval.defaults import ServeOptions
    from triskele.train.commands import add_dataclass_flags

    parser = argparse.ArgumentParser()
    add_dataclass_flags(parser, ServeOptions)
    parsed = parser.parse_args([])
    assert ServeOptions(**vars(parsed)) == ServeOptions(), "every field a flag, every default the field's"
    given = parser.parse_args(["--max-batch", "8", "--timeout-seconds", "2.5", "--token-file", "t.txt"])
    assert (given.max_batch, given.timeout_seconds, given.token_file) == (8, 2.5, "t.txt")
    for flag, value in (("--port", "65536"), ("--max-batch", "0"), ("--drain-seconds", "-1")):
        with pytest.raises(SystemExit):
            parser.parse_args([flag, value])
        assert f"argument {flag}: {value} is out of range" in capsys.readouterr().err
    assert len(dataclasses.fields(ServeOptions)) == len(vars(parsed)) == 14
