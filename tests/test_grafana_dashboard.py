"""deploy/grafana/netprobe.json: a Grafana dashboard model whose every PromQL expression
(panels and template variables) names only metrics the exporter really exports, and
returns data from a real Prometheus that scraped a real exporter: /metrics over a fleet
archive written through netprobe's archive API with real loopback results (TCP and
UDP, ok, failed, unreachable), and /probe blackbox style (one target that answers, one
that does not). Grafana itself is not packaged by Debian or PyPI, so the model is
checked for the fields Grafana needs rather than loaded."""
from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from netprobe import convert
from netprobe.archives import PairRecord, Run, open_archive

from .servers import NETPROBE, free_port, netprobe_server, wait_listening

prometheus_client = pytest.importorskip("prometheus_client",
                                        reason="pip install 'netprobe-meter[exporter]'")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "netprobe.json"
PROVISIONING = DASHBOARD.parent / "provisioning" / "dashboards.yaml"

# Grafana's variables as a dashboard with "All" selected expands them (allValue ".*"),
# and as one with real values picked (a multi-value variable becomes "(a|b)").
ALL = {"group": ".*", "agent": ".*", "module": ".*"}
PICKED = {"group": "core", "agent": "(a|b)", "module": "(default|udp|dead)"}
BUILTINS = {"__range": "10m", "__rate_interval": "1m", "__interval": "15s"}

PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
                "unless", "bool", "offset", "inf", "nan"}


# --- reading the dashboard ----------------------------------------------------------------


def _load(text: str | None = None) -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text() if text is None else text)


def _panels(model: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows' nested panels included."""
    for panel in model["panels"]:
        yield panel
        yield from panel.get("panels", [])


def panel_exprs(model: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) of every query of every panel."""
    return [(panel["title"], target["expr"]) for panel in _panels(model)
            for target in panel.get("targets", [])]


def variable_queries(model: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(variable, selector, label) of each ``label_values(selector, label)`` variable."""
    found = []
    for var in model["templating"]["list"]:
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        match = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", query)
        assert match, f"variable {var['name']}: not a label_values() query: {query}"
        found.append((var["name"], match[1], match[2]))
    return found


def substitute(expr: str, values: dict[str, str]) -> str:
    """``expr`` with Grafana's variables replaced as Grafana would; KeyError for one the
    test does not know (a new variable must be given values here too)."""
    every = {**BUILTINS, **values}
    return re.sub(r"\$\{?([A-Za-z_]\w*)\}?", lambda m: every[m[1]], expr)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not functions, keywords, labels,
    strings, ranges or numbers)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.$])[A-Za-z_:][A-Za-z0-9_:]*", text):
        if text[match.end():].lstrip().startswith("(") or match[0].lower() in PROMQL_WORDS:
            continue  # a function, an aggregation, or a keyword
        names.add(match[0])
    return names


def all_metric_names(model: dict[str, Any]) -> dict[str, set[str]]:
    """Metric name -> the places (panel titles, variables) that use it."""
    used: dict[str, set[str]] = {}
    for title, expr in panel_exprs(model):
        for name in metric_names(substitute(expr, ALL)):
            used.setdefault(name, set()).add(title)
    for var, selector, _ in variable_queries(model):
        for name in metric_names(substitute(selector, ALL)):
            used.setdefault(name, set()).add(f"${var}")
    return used


def _broken_copy() -> dict[str, Any]:
    """The dashboard with one metric renamed to one the exporter does not export."""
    text = DASHBOARD.read_text()
    assert "netprobe_fleet_agent_rtt_seconds" in text
    return _load(text.replace("netprobe_fleet_agent_rtt_seconds", "netprobe_fleet_agent_rtt_ms"))


# --- a real exporter over a real archive ---------------------------------------------------


def _result(*flags: str) -> Any:
    run = subprocess.run([*NETPROBE, "run", "-t", "0.5", "--json", *flags],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return convert.from_json(run.stdout)


@pytest.fixture(scope="module")
def archive_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fleet archive: a->b TCP ok, b->a UDP ok (real loopback results), a->c unreachable,
    c->a failed; so agent c is down and a, b are up."""
    tcp, udp = _result(), _result("-u")
    path = tmp_path_factory.mktemp("grafana") / "fleet.db"
    stamp = "2026-12-01T10:00:01.000+00:00"
    with open_archive(str(path)) as archive:
        archive.start_run(Run("r1", "fleet.toml", "2026-12-01T10:00:00.000+00:00", 1, 4))
        archive.add(PairRecord("r1", "core", 1, "a", "b", stamp, "ok", None, tcp))
        archive.add(PairRecord("r1", "core", 1, "b", "a", stamp, "ok", None, udp))
        archive.add(PairRecord("r1", "core", 1, "a", "c", stamp, "unreachable", "no agent"))
        archive.add(PairRecord("r1", "core", 1, "c", "a", stamp, "failed", "refused"))
    return path


@pytest.fixture(scope="module")
def exporter_base(archive_path: Path, tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[str]:
    """An exporter serving the archive on /metrics, and /probe with modules whose target
    answers (a netprobe server on loopback; TCP and UDP) and one whose target does not."""
    config = tmp_path_factory.mktemp("grafana-exp") / "exporter.toml"
    with netprobe_server() as server:
        config.write_text(f'[modules.default]\ntargets = ["127.0.0.1"]\nport = {server.port}\n'
                          f'[modules.udp]\ntargets = ["127.0.0.1"]\nport = {server.port}\n'
                          'protocol = "udp"\n'
                          f'[modules.dead]\ntargets = ["127.0.0.1"]\nport = {free_port()}\n')
        port = free_port()
        proc = subprocess.Popen([*NETPROBE, "exporter", "--port", str(port), "--archive",
                                 str(archive_path), "--config", str(config)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_listening(port)
            yield f"127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(10)


def _get(url: str, timeout: float = 30) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture(scope="module")
def exported(exporter_base: str) -> set[str]:
    """Every metric name the exporter served: /metrics, ok /probes and a failed one."""
    names: set[str] = set()
    for path in ("/metrics", "/probe?target=127.0.0.1&duration=0.5",
                 "/probe?target=127.0.0.1&module=udp&duration=0.5",
                 "/probe?target=127.0.0.1&module=dead&duration=0.5"):
        status, text = _get(f"http://{exporter_base}{path}")
        assert status == 200, f"{path}: {text}"
        names |= {sample.name for family in text_string_to_metric_families(text)
                  for sample in family.samples}
    return names


# --- a real Prometheus scraping it --------------------------------------------------------


def _prometheus_config(exporter: str) -> str:
    """Four jobs: the fleet's /metrics, and /probe as blackbox_exporter's (modules whose
    target answers, over TCP and UDP, and one whose target does not)."""
    probe = ("  - job_name: {job}\n    metrics_path: /probe\n    scrape_interval: 3s\n"
             "    scrape_timeout: 3s\n    params: {{ module: [{module}], duration: ['0.5'] }}\n"
             "    static_configs: [{{ targets: ['127.0.0.1'] }}]\n    relabel_configs:\n"
             "      - {{ source_labels: [__address__], target_label: __param_target }}\n"
             "      - {{ source_labels: [__param_target], target_label: instance }}\n"
             f"      - {{{{ target_label: __address__, replacement: '{exporter}' }}}}\n")
    return ("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n"
            f"  - job_name: netprobe_fleet\n    static_configs: [{{ targets: ['{exporter}'] }}]\n"
            + probe.format(job="netprobe_probe", module="default")
            + probe.format(job="netprobe_probe_udp", module="udp")
            + probe.format(job="netprobe_probe_dead", module="dead"))


def _api(port: int, path: str, **params: str) -> dict[str, Any]:
    url = f"http://127.0.0.1:{port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    _, text = _get(url, timeout=10)
    return dict(json.loads(text))


@pytest.fixture(scope="module")
def prometheus(exporter_base: str) -> Iterator[int]:
    """A real Prometheus that has scraped every job at least twice (bounded wait)."""
    if not shutil.which("prometheus"):
        pytest.skip("Debian's prometheus is not installed")
    with tempfile.TemporaryDirectory(prefix="netprobe-grafana-prom-") as folder:
        config = Path(folder) / "prometheus.yml"
        config.write_text(_prometheus_config(exporter_base))
        port = free_port()
        proc = subprocess.Popen(["prometheus", f"--config.file={config}",
                                 f"--storage.tsdb.path={folder}/data",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            ready = ("count_over_time(netprobe_fleet_agent_up[1m])",
                     "count_over_time(netprobe_up{module='default'}[1m])",
                     "count_over_time(netprobe_jitter_seconds[1m])",
                     "count_over_time(netprobe_probe_failed_info[1m])")
            end = time.monotonic() + 60
            while time.monotonic() < end and not all(_twice(port, query) for query in ready):
                time.sleep(1)
            assert all(_twice(port, query) for query in ready), "Prometheus scraped too little"
            yield port
        finally:
            proc.terminate()
            proc.wait(20)


def _twice(port: int, query: str) -> bool:
    with contextlib.suppress(OSError, ValueError, KeyError):
        found = _api(port, "query", query=query)["data"]["result"]
        return bool(found) and all(float(series["value"][1]) >= 2 for series in found)
    return False


def failures(port: int, model: dict[str, Any], values: dict[str, str]) -> list[str]:
    """One line per expression that errs or returns no data, instant or over a range, and
    per variable whose label_values() finds no value."""
    now = time.time()
    bad = []
    for title, expr in panel_exprs(model):
        query = substitute(expr, values)
        for kind, params in (("query", {"query": query, "time": f"{now}"}),
                             ("query_range", {"query": query, "start": f"{now - 30}",
                                              "end": f"{now}", "step": "2"})):
            answer = _api(port, kind, **params)
            if answer.get("status") != "success" or not answer["data"]["result"]:
                bad.append(f"{title!r} ({kind}) {query}: {answer.get('error', 'no data')}")
    for var, selector, label in variable_queries(model):
        match = substitute(selector, values)  # as Grafana asks it: the series, then the label
        answer = _api(port, "series", **{"match[]": match, "start": f"{now - 30}",
                                         "end": f"{now}"})
        found = {series.get(label) for series in answer.get("data", [])} - {None, ""}
        if answer.get("status") != "success" or not found:
            bad.append(f"${var} {match} -> {label}: {answer.get('error', 'no values')}")
    return bad


# --- the tests ----------------------------------------------------------------------------


def test_the_model_has_what_grafana_needs() -> None:
    model = _load()
    assert model["schemaVersion"] >= 36 and model["uid"] and model["title"]
    assert [item["name"] for item in model["__inputs"]] == ["DS_PROMETHEUS"]
    ids = [panel["id"] for panel in _panels(model)]
    assert len(ids) == len(set(ids))
    for panel in _panels(model):
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
            refs = [target["refId"] for target in panel["targets"]]
            assert refs and len(refs) == len(set(refs)), panel["title"]
    kinds = {panel["type"] for panel in _panels(model)}
    assert {"table", "timeseries", "state-timeline"} <= kinds
    matrix = [panel for panel in _panels(model) if any(
        step["id"] == "groupingToMatrix" for step in panel.get("transformations", []))]
    assert matrix and all(panel["targets"][0]["format"] == "table" for panel in matrix)
    assert [name for name, _, _ in variable_queries(model)] == ["group", "agent", "module"]
    for _, expr in panel_exprs(model):  # every variable used is one the model defines
        substitute(expr, ALL)


def test_the_provisioning_file_points_at_a_folder_of_dashboards() -> None:
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")
    provisioning = yaml.safe_load(PROVISIONING.read_text())
    assert provisioning["apiVersion"] == 1
    (provider,) = provisioning["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards/netprobe"


def test_metric_names_are_read_from_promql() -> None:
    expr = ('max by (group, agent) (label_replace(netprobe_fleet_up{source=~"a"}, "agent", '
            '"$1", "source", "(.*)") or time() - x_total[5m] offset 1m > 1e6)')
    assert metric_names(expr) == {"netprobe_fleet_up", "x_total"}


def test_every_metric_it_names_is_exported(exported: set[str]) -> None:
    used = all_metric_names(_load())
    assert used and not {name: places for name, places in used.items()
                         if name not in exported}
    # and the check fails on a dashboard that names a metric the exporter does not export
    broken = all_metric_names(_broken_copy())
    assert {name for name in broken if name not in exported} == {"netprobe_fleet_agent_rtt_ms"}


@pytest.mark.slow
def test_every_expression_returns_data_from_a_real_prometheus(prometheus: int) -> None:
    model = _load()
    assert len(panel_exprs(model)) >= 10
    for values in (ALL, PICKED):
        assert failures(prometheus, model, values) == [], values
    # the same check fails when an expression names a metric nobody exports
    broken = failures(prometheus, _broken_copy(), ALL)
    assert broken and all("netprobe_fleet_agent_rtt_ms" in line for line in broken)
    assert len(broken) == 2  # its panel, instant and over a range
