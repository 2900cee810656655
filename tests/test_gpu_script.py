"""bench/gpu.sh, the prepared first-GPU check, run in its --cpu mode so that it cannot rot."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_script_cpu_mode_writes_its_tables(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    done = subprocess.run(["bash", str(ROOT / "bench" / "gpu.sh"), "--cpu", "--out", str(tmp_path)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "gpu.json").read_text())
    assert [(r["preset"], r["precision"]) for r in result["training"]] == [("mars-tiny", "bfloat16"),
                                                                          ("mars-tiny", "fp8")]
    for row in result["training"]:
        assert row["step_ms"] > 0 and row["predicted_step_ms"] > 0 and row["fp8_gemm_calls"] == 0  # no cuBLASLt on CPU
    assert [r["format"] for r in result["predict"]] == ["int8"]  # a quantized checkpoint, loaded and run
    assert all(r["images_per_sec"] > 0 and r["bound"] in ("memory", "compute") for r in result["predict"])
    table = (tmp_path / "gpu.md").read_text()
    assert "| mars-tiny | fp8 |" in table and "### Predict, forward only" in table
