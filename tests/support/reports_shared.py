"""Data and helpers shared by tests/unit/test_reports.py (in-process)
and tests/integration/test_reports_process.py (its process cases)."""

from __future__ import annotations

from provisioner.results import DriftItem, RunResult, TaskFailure

NCCL_DIFF = "--- before: /etc/nccl.conf\n+++ after: /etc/nccl.conf\n@@ -1 +1 @@\n-NCCL_IB_HCA=mlx5_9\n+NCCL_IB_HCA=mlx5_0\n"


def drift_result() -> RunResult:
    r = RunResult(command="drift", inventory="inventories/rack.ini", playbook="playbooks/site.yml",
                  run_dir="/tmp/.runs/x-drift", artifact_dir="/tmp/.runs/x-drift/artifacts/ansible",
                  started=1_790_000_000.0, duration=12.5, check=True, status="successful", rc=0,
                  targeted=["node01", "node02", "node03", 'odd"name\\x'])
    n1 = r.host("node01")
    n1.seen, n1.ok, n1.changed, n1.roles = True, 20, 4, ["nccl_tuning", "nvidia_persistenced", "nvidia_driver"]
    n1.drift = [
        DriftItem("node01", "Render /etc/nccl.conf", "file", "/etc/nccl.conf", role="nccl_tuning",
                  action="template", diff=NCCL_DIFF),
        DriftItem("node01", "Start nvidia-persistenced", "service", "nvidia-persistenced",
                  role="nvidia_persistenced", action="systemd_service"),
        DriftItem("node01", "Install the pinned driver", "package", "nvidia-fabricmanager-580",
                  role="nvidia_driver", action="apt"),
        DriftItem("node01", "Persistenced unit", "file", "/etc/systemd/system/nvidia-persistenced.service",
                  role="nvidia_persistenced", action="template", diff="--- a\n+++ b\n@@ -1 +1 @@\n-x\n+y\n"),
    ]
    n2 = r.host("node02")
    n2.seen, n2.ok, n2.roles = True, 20, ["nccl_tuning", "nvidia_driver"]
    n3 = r.host("node03")
    n3.seen, n3.unreachable = True, 1
    n3.unreachable_message = "Failed to connect to the host via ssh: Connection refused"
    odd = r.host('odd"name\\x')
    odd.seen, odd.ok, odd.failed, odd.roles = True, 2, 1, [""]
    odd.failures = [TaskFailure('odd"name\\x', "Read driver version", "rc 127: nvidia-smi: not found",
                                role=None)]
    return r
