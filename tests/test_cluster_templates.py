"""The cluster templates in examples/: what they run and what they expose."""

import os
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_sbatch_hands_the_workdir_to_python_as_one_argument_and_runs_nothing_from_it(tmp_path):
    """`srun` and `python` replaced by recorders: a WORKDIR holding shell syntax reaches python
    verbatim and is never run."""
    bin_dir, planted = tmp_path / "bin", tmp_path / "pwned"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\nexec "$@"\n')
    (bin_dir / "python").write_text(f'#!/bin/bash\nprintf "%s\\n" "$@" > {shlex.quote(str(tmp_path / "argv"))}\n')
    for tool in ("srun", "python"):
        (bin_dir / tool).chmod(0o755)
    workdir = f"/tmp/x; touch {planted} #"
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", WORKDIR=workdir, SLURM_LOCALID="0")
    result = subprocess.run(["bash", str(EXAMPLES / "slurm.sbatch")], env=env, capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 0, result.stderr
    assert not planted.exists()
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv[argv.index("--workdir") + 1] == workdir


def test_jobset_pods_run_unprivileged_and_only_the_jobs_pods_reach_them():
    jobset, policy = yaml.safe_load_all((EXAMPLES / "jobset.yaml").read_text())
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    for container in pod["containers"]:
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    own_pods = {"jobset.sigs.k8s.io/jobset-name": jobset["metadata"]["name"]}
    assert policy["kind"] == "NetworkPolicy" and policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["podSelector"]["matchLabels"] == own_pods
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": own_pods}}]}]


def test_the_serving_deployment_probes_readiness_drains_inside_its_grace_and_mounts_the_model_read_only(capsys):
    from triskele.eval.cli import main as eval_main

    deployment, service = yaml.safe_load_all((EXAMPLES / "serve-deployment.yaml").read_text())
    assert deployment["kind"] == "Deployment" and service["kind"] == "Service"
    pod = deployment["spec"]["template"]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"] == pod["metadata"]["labels"]
    (container,) = pod["spec"]["containers"]
    args = container["args"]
    port = int(args[args.index("--port") + 1])
    assert container["ports"] == [{"name": "http", "containerPort": port}]
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and int(annotations["prometheus.io/port"]) == port
    assert annotations["prometheus.io/path"] == "/metrics"
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep" and float(pre_stop[1]) >= 5  # the load balancer stops routing before SIGTERM
    drain = float(args[args.index("--drain-seconds") + 1])
    assert pod["spec"]["terminationGracePeriodSeconds"] > float(pre_stop[1]) + drain
    memory = {kind: container["resources"][kind]["memory"] for kind in ("requests", "limits")}
    assert all(value.endswith("Gi") for value in memory.values())
    assert int(memory["requests"][:-2]) <= int(memory["limits"][:-2])
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    workdir = args[args.index("--workdir") + 1]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    (store,) = [m for m in container["volumeMounts"] if workdir.startswith(m["mountPath"] + "/")]
    assert store["readOnly"] is True and volumes[store["name"]]["persistentVolumeClaim"]["readOnly"] is True
    # every flag is one of serve's own (its --help lists them)
    assert container["command"][-3:] == ["-m", "triskele.eval", "serve"]
    with pytest.raises(SystemExit) as parsed:
        eval_main(["serve", "--help"])
    assert parsed.value.code == 0
    listed = capsys.readouterr().out
    assert all(f"{flag} " in listed for flag in args if flag.startswith("--")), listed
