"""deploy/: the Kubernetes manifests pass the real API schemas (kubernetes-validate, strict),
their fleet file is a fleet file netprobe reads, their agents' own command line runs with
the Secret's file and refuses who it should, and the Ansible role runs (check mode, into a
scratch root) with the systemd unit of deploy/systemd."""
from __future__ import annotations

import copy
import ipaddress
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from netprobe.fleet import config
from tests.servers import free_port, wait_listening

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


def _by_kind(name: str) -> dict[str, dict]:
    return {d["kind"]: d for d in _documents(name)}


_K8S_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _container_argv(documents: list[dict], kind: str, replace: dict[str, str]) -> list[str]:
    """The first container's command line as Kubernetes starts it: its command, else the
    image's ENTRYPOINT (the Dockerfile's), then its args, each ``$(VAR)`` replaced by the
    variable's value from the container's env (a ConfigMap key, looked up in
    ``documents``) and ``$$`` by ``$``, as the kubelet does; then each ``replace`` key in
    an argument by its value (a mount path by where the test put the files)."""
    pod = next(d for d in documents if d["kind"] == kind)["spec"]["template"]["spec"]
    container = pod["containers"][0]
    maps = {d["metadata"]["name"]: d["data"] for d in documents if d["kind"] == "ConfigMap"}
    env = {}
    for item in container.get("env", []):
        ref = item.get("valueFrom", {}).get("configMapKeyRef")
        env[item["name"]] = maps[ref["name"]][ref["key"]] if ref else item["value"]
    entrypoint = re.search(r"^ENTRYPOINT (\[.*\])$",
                           (DEPLOY / "kubernetes" / "Dockerfile").read_text(), re.M)
    assert entrypoint is not None
    argv = [*(container.get("command") or json.loads(entrypoint.group(1))),
            *container.get("args", [])]
    expanded = [_K8S_VAR.sub(lambda m: env.get(m.group(1), m.group(0)) if m.group(1) else "$",
                             arg) for arg in argv]
    for old, new in replace.items():
        expanded = [arg.replace(old, new) for arg in expanded]
    return expanded


def _secret_mount(documents: list[dict], kind: str) -> tuple[str, str]:
    """(mount path, Secret name) of the first container's Secret volume."""
    pod = next(d for d in documents if d["kind"] == kind)["spec"]["template"]["spec"]
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] in secrets]
    return mount["mountPath"], secrets[mount["name"]]


def test_kubernetes_agents_take_the_secret_and_only_the_allowed_network() -> None:
    # The agents ran third-party tests for any address that reached them (no --allow): with
    # a leaked secret, anyone could make every node send anywhere.
    documents = _documents("agents.yaml")
    argv = _container_argv(documents, "DaemonSet", {})
    assert argv[:2] == ["netprobe", "server"]
    mount, secret_name = _secret_mount(documents, "DaemonSet")
    assert secret_name == "netprobe-secret"
    assert argv[argv.index("--secret-file") + 1] == f"{mount}/secret"  # the Secret's key
    allowed = ipaddress.ip_network(argv[argv.index("--allow") + 1])  # expanded: a network
    assert str(allowed) == _by_kind("agents.yaml")["ConfigMap"]["data"]["allow"]
    # the fleet's run connects from a node address (hostNetwork) with the same secret, and
    # its agents are in the network the agents allow
    fleet = _by_kind("fleet-cronjob.yaml")
    job = fleet["CronJob"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert job["hostNetwork"] is True
    cron_docs = _documents("fleet-cronjob.yaml")
    fleet_mount, fleet_secret = _secret_mount(
        [{"kind": "Job", "spec": {"template": {"spec": job}}}, *cron_docs], "Job")
    assert fleet_secret == secret_name
    parsed = config.parse(config.tomllib.loads(fleet["ConfigMap"]["data"]["fleet.toml"]),
                          "fleet.toml")
    assert {a.secret_file for a in parsed.agents.values()} == {f"{fleet_mount}/secret"}
    assert all(ipaddress.ip_address(a.address) in allowed for a in parsed.agents.values())


def test_the_kubernetes_agent_runs_with_the_manifests_command_line(tmp_path: Path) -> None:
    # The DaemonSet's own command line (the image's entry point, the args with the
    # ConfigMap's network put in), the Secret's file where the volume mounts it, started
    # here as the kubelet would, on loopback. The network is configured as a user would:
    # this host's own, then the shipped one, which loopback is not in.
    documents = _documents("agents.yaml")
    mount, _ = _secret_mount(documents, "DaemonSet")
    secret_dir = tmp_path / "secret-volume"
    secret_dir.mkdir()
    (secret_dir / "secret").write_text("a fleet's secret, as base64 wrote it\n")
    (secret_dir / "secret").chmod(0o440)
    netprobe = shutil.which("netprobe", path=str(Path(sys.executable).parent))
    assert netprobe is not None
    shipped = _by_kind("agents.yaml")["ConfigMap"]["data"]["allow"]
    for network in ("127.0.0.0/8", shipped):
        for document in documents:
            if document["kind"] == "ConfigMap":
                document["data"]["allow"] = network
        argv = _container_argv(documents, "DaemonSet", {mount: str(secret_dir)})
        assert argv[argv.index("--allow") + 1] == network
        argv[0] = netprobe
        port = free_port()
        server = subprocess.Popen([*argv, "-B", "127.0.0.1", "-p", str(port)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_listening(port)
            client = [sys.executable, "-m", "netprobe", "run", "127.0.0.1", "-p", str(port),
                      "-t", "0.3", "--json"]
            ok = subprocess.run([*client, "--secret-file", str(secret_dir / "secret")],
                                capture_output=True, text=True, timeout=60)
            without = subprocess.run(client, capture_output=True, text=True, timeout=60)
        finally:
            server.terminate()
            server.wait(10)
        assert without.returncode != 0, without.stdout
        if network == shipped:  # not even the secret gets a client outside the network in
            assert ok.returncode != 0, ok.stdout
            continue
        assert ok.returncode == 0, ok.stderr
        assert json.loads(ok.stdout)["status"] == "ok"
        assert "secret" in without.stderr


def _ansible_playbook() -> str | None:
    return shutil.which("ansible-playbook", path=str(Path(sys.executable).parent)) \
        or shutil.which("ansible-playbook")


needs_ansible = pytest.mark.skipif(_ansible_playbook() is None,
                                   reason="ansible-core is not installed")


def _play(tmp_path: Path, *args: str, **extra: object) -> subprocess.CompletedProcess:
    """ansible-playbook on deploy/ansible into a scratch root, this host as the one agent."""
    inventory = tmp_path / "inventory.ini"
    inventory.write_text(f"localhost ansible_connection=local "
                         f"ansible_python_interpreter={sys.executable}\n"
                         "[netprobe_agents]\nlocalhost\n")
    variables = {"netprobe_root": str(tmp_path / "root"), "netprobe_manage_service": False,
                 **extra}
    return subprocess.run(
        [str(_ansible_playbook()), "-i", str(inventory),
         str(DEPLOY / "ansible" / "playbook.yml"), *args, "-e", json.dumps(variables)],
        capture_output=True, text=True, timeout=600,
        env={"ANSIBLE_NOCOLOR": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
             "ANSIBLE_LOCAL_TEMP": str(tmp_path), "PIP_FIND_LINKS": "/opt/wheels",
             "PIP_CONSTRAINT": ""})


@pytest.mark.slow
@needs_ansible
def test_ansible_role_runs_in_check_mode(tmp_path: Path) -> None:
    root = tmp_path / "root"
    # Check mode parses the whole playbook (what --syntax-check does) and runs every task.
    run = _play(tmp_path, "--check", "--diff", netprobe_secret="fleet-secret")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "failed=0" in run.stdout
    assert f"LoadCredential=secret:{root}/etc/netprobe/secret" in run.stdout
    assert "server --secret-file=%d/secret --allow " in run.stdout
    assert "fleet-secret" not in run.stdout  # no_log keeps it out of the output
    assert not root.exists()  # check mode changed nothing


@pytest.mark.slow
@needs_ansible
def test_ansible_defaults_deploy_no_open_relay(tmp_path: Path) -> None:
    # The role's defaults once deployed --allow-third-party with no secret and no --allow:
    # any address could make every agent send anywhere. Now: third-party off, a secret
    # generated for the fleet, the fleet's own addresses as --allow.
    run = _play(tmp_path, "--check", "--diff")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    # the drop-in's line (the unit's own ExecStart, with $NETPROBE_SERVER_ARGS, is in the diff too)
    (line,) = [x for x in run.stdout.splitlines()
               if x.startswith("+ExecStart=/usr/bin/netprobe server -")]
    assert "--allow-third-party" not in line
    assert "--secret-file=%d/secret" in line and " --allow " in line
    secret = (tmp_path / "netprobe-fleet.secret").read_text().strip()
    assert len(secret) >= 32 and secret not in run.stdout
    again = _play(tmp_path, "--check")  # one secret per fleet: kept, not drawn anew
    assert again.returncode == 0 and (tmp_path / "netprobe-fleet.secret").read_text().strip() \
        == secret
    assert _play(tmp_path, "--check", netprobe_allow_third_party=True).returncode == 0


@pytest.mark.slow
@needs_ansible
def test_ansible_role_refuses_an_allow_list_that_is_not_addresses(tmp_path: Path) -> None:
    run = _play(tmp_path, "--check", netprobe_allow=["not-an-address"])
    assert run.returncode != 0
    assert "netprobe_allow must name the fleet's addresses" in run.stdout


@pytest.mark.slow
@needs_ansible
def test_the_deployed_agent_runs_with_the_roles_options(tmp_path: Path) -> None:
    # The role for real into a scratch root (netprobe installed from this checkout into its
    # venv), then the server started from the drop-in's own ExecStart, as systemd would.
    root = tmp_path / "root"
    run = _play(tmp_path, netprobe_package=str(ROOT), netprobe_allow_extra=["127.0.0.1"])
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    dropin = (root / "etc/systemd/system/netprobe-server.service.d/agent.conf").read_text()
    (start,) = [x.split("=", 1)[1] for x in dropin.splitlines()
                if x.startswith("ExecStart=/")]
    credentials = root / "etc/netprobe"  # what LoadCredential hands the service as %d
    assert oct((credentials / "secret").stat().st_mode & 0o777) == "0o600"
    argv = start.replace("%d", str(credentials)).split()
    argv[0] = str(root / "usr/bin/netprobe")
    port = free_port()
    server = subprocess.Popen([*argv, "-B", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_listening(port)
        client = [sys.executable, "-m", "netprobe", "run", "127.0.0.1", "-p", str(port),
                  "-t", "0.5", "--json"]
        ok = subprocess.run([*client, "--secret-file", str(credentials / "secret")],
                            capture_output=True, text=True, timeout=60)
        assert ok.returncode == 0, ok.stderr
        assert json.loads(ok.stdout)["status"] == "ok"
        without = subprocess.run(client, capture_output=True, text=True, timeout=60)
        assert without.returncode != 0 and "secret" in without.stderr
        third = subprocess.run([sys.executable, "-m", "netprobe", "run", "--from", "127.0.0.1",
                                "--to", "127.0.0.1", "--agent-port", str(port), "-t", "0.5",
                                "--secret-file", str(credentials / "secret")],
                               capture_output=True, text=True, timeout=60)
        assert third.returncode != 0 and "third" in third.stderr.lower()
    finally:
        server.terminate()
        server.wait(10)


# --- stock iperf3 clients (netprobe server --iperf3): off unless asked, working when asked --


def _stock_iperf3() -> str:
    found = shutil.which("iperf3")
    if found is None:
        pytest.skip("no stock iperf3 client (apt install iperf3)")
    return found


def _iperf3_client(port: int) -> subprocess.CompletedProcess:
    return subprocess.run([_stock_iperf3(), "-c", "127.0.0.1", "-p", str(port), "-t", "1",
                           "-J"], capture_output=True, text=True, timeout=60)


def _closed(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        sock.settimeout(5)
        return sock.connect_ex(("127.0.0.1", port)) != 0


def _served(argv: list[str], iperf3_port: int) -> tuple[subprocess.CompletedProcess | None,
                                                        bool]:
    """Start ``argv`` (a deploy file's server command line) on loopback; with its iperf3
    listener on ``iperf3_port`` a stock client's run (else None) and whether the port was
    closed."""
    port = free_port()
    server = subprocess.Popen([*argv, "-B", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(port)
        if "--iperf3" not in argv:
            return None, _closed(iperf3_port)
        wait_listening(iperf3_port)
        return _iperf3_client(iperf3_port), False
    finally:
        server.terminate()
        server.wait(10)


def _json_patch(document: dict, operations: list[dict]) -> dict:
    """``operations`` (RFC 6902 "add", as kubectl patch --type json applies them) on a copy."""
    patched = copy.deepcopy(document)
    for operation in operations:
        assert operation["op"] == "add"
        *parents, last = operation["path"].lstrip("/").split("/")
        node: Any = patched
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if isinstance(node, list):
            node.insert(len(node) if last == "-" else int(last), operation["value"])
        else:
            node[last] = operation["value"]
    return patched


def test_kubernetes_agents_serve_iperf3_clients_only_when_patched_to(tmp_path: Path) -> None:
    # The DaemonSet as shipped starts no iperf3 listener; deploy/kubernetes/iperf3-patch.json
    # (what the README has `kubectl patch` apply) turns it on, and the patched DaemonSet
    # passes the API schemas and serves a stock client.
    documents = _documents("agents.yaml")
    daemonset = next(d for d in documents if d["kind"] == "DaemonSet")
    patch = json.loads((DEPLOY / "kubernetes" / "iperf3-patch.json").read_text())
    patched = _json_patch(daemonset, patch)
    _validate(patched)
    mount, _ = _secret_mount(documents, "DaemonSet")
    secret_dir = tmp_path / "secret-volume"
    secret_dir.mkdir()
    (secret_dir / "secret").write_text("a fleet's secret\n")
    for document in documents:
        if document["kind"] == "ConfigMap":
            document["data"]["allow"] = "127.0.0.0/8"
    netprobe = shutil.which("netprobe", path=str(Path(sys.executable).parent))
    assert netprobe is not None
    (declared,) = [p["containerPort"] for p in patched["spec"]["template"]["spec"]
                   ["containers"][0]["ports"] if p["name"] == "iperf3"]
    assert declared == 5201  # the server's default port, which the patch does not move
    iperf3_port = free_port()  # 5201 itself may be taken on a shared test host
    for manifest, on in ((daemonset, False), (patched, True)):
        argv = _container_argv([*(d for d in documents if d["kind"] != "DaemonSet"), manifest],
                               "DaemonSet", {mount: str(secret_dir)})
        assert ("--iperf3" in argv) is on
        argv[0] = netprobe
        run, closed = _served([*argv, "--iperf3-port", str(iperf3_port)] if on else argv,
                              iperf3_port)
        if not on:
            assert closed
            continue
        assert run is not None and run.returncode == 0, run and run.stdout[-800:]
        assert json.loads(run.stdout)["end"]["sum_received"]["bytes"] > 0


def _ansible_line(tmp_path: Path, **extra: object) -> list[str]:
    """The drop-in's ExecStart in check mode (its diff), as argv with %d a scratch
    credentials directory holding a secret, the binary this venv's netprobe."""
    run = _play(tmp_path, "--check", "--diff", netprobe_allow_extra=["127.0.0.1"], **extra)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    (line,) = [x for x in run.stdout.splitlines()
               if x.startswith("+ExecStart=/usr/bin/netprobe server -")]
    credentials = tmp_path / "credentials"
    credentials.mkdir(exist_ok=True)
    (credentials / "secret").write_text("fleet-secret\n")
    argv = line.split("=", 1)[1].replace("%d", str(credentials)).split()
    netprobe = shutil.which("netprobe", path=str(Path(sys.executable).parent))
    assert netprobe is not None
    return [netprobe, *argv[1:]]


@pytest.mark.slow
@needs_ansible
def test_ansible_agents_serve_iperf3_clients_only_when_asked(tmp_path: Path) -> None:
    _stock_iperf3()
    iperf3_port = free_port()
    off = _ansible_line(tmp_path, netprobe_iperf3_port=iperf3_port)  # a port, no switch
    assert "--iperf3" not in off
    assert _served(off, iperf3_port) == (None, True)
    on = _ansible_line(tmp_path, netprobe_iperf3=True, netprobe_iperf3_port=iperf3_port)
    assert on[on.index("--iperf3-port") + 1] == str(iperf3_port)
    run, _ = _served(on, iperf3_port)
    assert run is not None and run.returncode == 0, run and run.stdout[-800:]
    assert json.loads(run.stdout)["end"]["sum_received"]["bytes"] > 0
    bad = _play(tmp_path, "--check", netprobe_iperf3=True, netprobe_iperf3_port="http")
    assert bad.returncode != 0 and "netprobe_iperf3_port must be a TCP port" in bad.stdout
