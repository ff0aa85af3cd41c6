"""deploy/: the Kubernetes manifests pass the real API schemas (kubernetes-validate, strict),
their fleet file is a fleet file netprobe reads, and the Ansible role runs (check mode,
into a scratch root) with the systemd unit of deploy/systemd."""
from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from netprobe.fleet import config

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")


def _documents(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()) if d]


def _validate(document: dict) -> None:
    validator = pytest.importorskip("kubernetes_validate",
                                    reason="pip install kubernetes-validate")
    validator.validate(document, validator.latest_version(), strict=True)


@pytest.mark.parametrize("name", ["agents.yaml", "fleet-cronjob.yaml"])
def test_manifests_pass_the_kubernetes_schemas(name: str) -> None:
    documents = _documents(name)
    assert documents
    for document in documents:
        _validate(document)


def test_a_broken_manifest_is_refused() -> None:
    validator = pytest.importorskip("kubernetes_validate")
    daemonset = next(d for d in _documents("agents.yaml") if d["kind"] == "DaemonSet")
    broken = copy.deepcopy(daemonset)
    broken["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "x"
    with pytest.raises(validator.ValidationError):
        _validate(broken)


def test_manifests_say_what_a_fleet_needs() -> None:
    agents = {d["kind"]: d for d in _documents("agents.yaml")}
    pod = agents["DaemonSet"]["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True  # the node's own paths, not the overlay's
    assert "--allow-third-party" in pod["containers"][0]["args"]
    assert {p["protocol"] for p in pod["containers"][0]["ports"]} == {"TCP", "UDP"}
    assert agents["Service"]["spec"]["clusterIP"] == "None"
    fleet = {d["kind"]: d for d in _documents("fleet-cronjob.yaml")}
    assert fleet["CronJob"]["spec"]["concurrencyPolicy"] == "Forbid"
    text = fleet["ConfigMap"]["data"]["fleet.toml"]
    parsed = config.parse(config.tomllib.loads(text), "fleet.toml")
    assert [g.kind for g in parsed.groups] == ["mesh"] and len(parsed.agents) == 3


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("ansible-playbook", path=str(Path(sys.executable).parent))
                    and not shutil.which("ansible-playbook"),
                    reason="ansible-core is not installed")
def test_ansible_role_runs_in_check_mode(tmp_path: Path) -> None:
    playbook = shutil.which("ansible-playbook", path=str(Path(sys.executable).parent)) \
        or shutil.which("ansible-playbook")
    assert playbook
    inventory = tmp_path / "inventory.ini"
    inventory.write_text(f"localhost ansible_connection=local "
                         f"ansible_python_interpreter={sys.executable}\n"
                         "[netprobe_agents]\nlocalhost\n")
    root = tmp_path / "root"
    base = [playbook, "-i", str(inventory), str(DEPLOY / "ansible" / "playbook.yml")]
    # Check mode parses the whole playbook (what --syntax-check does) and runs every task.
    run = subprocess.run([*base, "--check", "--diff", "-e",
                          f'{{"netprobe_root": "{root}", "netprobe_manage_service": false, '
                          '"netprobe_secret": "fleet-secret"}'],
                         capture_output=True, text=True, timeout=300,
                         env={"ANSIBLE_NOCOLOR": "1", "PATH": "/usr/bin:/bin",
                              "HOME": str(tmp_path), "ANSIBLE_LOCAL_TEMP": str(tmp_path)})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "failed=0" in run.stdout
    assert f"LoadCredential=secret:{root}/etc/netprobe/secret" in run.stdout
    assert "--allow-third-party --secret-file=%d/secret" in run.stdout
    assert "fleet-secret" not in run.stdout  # no_log keeps it out of the output
    assert not root.exists()  # check mode changed nothing
