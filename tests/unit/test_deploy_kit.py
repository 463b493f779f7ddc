"""The deploy kit in deploy/ (docs/deploy.md): the image's build steps run for real into a fresh
venv, and the Dockerfile, compose.yaml, the Kubernetes manifests and the systemd unit are parsed
and checked against the gateway's own configuration rules (drain, probes, RTP ports)."""

from __future__ import annotations

import configparser
import ipaddress
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from appbridge.config import Config, ConfigError, parse_config

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
DOCKER = DEPLOY / "docker"
K8S = DEPLOY / "k8s"
UNIT = DEPLOY / "systemd" / "appbridge.service"
NODE_CONFIGS = ("node-a.toml", "node-b.toml")
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


# ---------------------------------------------------------------------- helpers
def env_file(path: Path) -> dict[str, str]:
    """``NAME=value`` lines, as compose's ``.env`` and systemd's EnvironmentFile read them."""
    values = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            values[name.strip()] = value.strip()
    return values


def loader_knows_cluster() -> bool:
    """``[cluster]`` is read by its own section reader once that lands; until then the loader
    calls it an unknown key, and these tests check the rest of each file."""
    try:
        parse_config({"cluster": {}})
    except ConfigError as exc:
        return "cluster: unknown key" not in exc.problems
    return True  # pragma: no cover - a file without [[apps]] is never valid


def without_cluster(text: str) -> str:
    """``text`` with its ``[cluster]`` table cut out (up to the next table header)."""
    return re.sub(r"(?ms)^\[cluster\]\n.*?(?=^\[)", "", text)


def check_cluster_table(table: Mapping[str, Any]) -> None:
    assert set(table) == {"node_id", "redis_url", "internal_url", "secret"}
    assert table["secret"] == "${APPBRIDGE_CLUSTER_SECRET}"
    assert str(table["redis_url"]).startswith("redis://")


def load_text(text: str, env: Mapping[str, str]) -> Config:
    """The gateway's own loader on ``text``; ``[cluster]`` checked by shape while the loader
    does not know it yet."""
    data = tomllib.loads(text)
    if "cluster" in data:
        check_cluster_table(data["cluster"])
        if not loader_knows_cluster():
            data = tomllib.loads(without_cluster(text))
    return parse_config(data, env, source="<deploy kit>", base_dir=REPO)


def refs(text: str) -> set[str]:
    return set(_ENV_REF.findall(text))


def seconds(text: str | int | float) -> float:
    """A compose duration (``45s``, ``1m30s``) in seconds."""
    if isinstance(text, int | float):
        return float(text)
    total = 0.0
    for amount, unit in re.findall(r"([0-9.]+)(ms|h|m|s)", text):
        total += float(amount) * {"h": 3600, "m": 60, "s": 1, "ms": 0.001}[unit]
    return total


def port_range(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    return int(low), int(high or low)


# ---------------------------------------------------------------------- Dockerfile
def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments left out."""
    joined: list[str] = []
    pending = ""
    for raw in (DOCKER / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not line or (line.startswith("#") and not pending):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        joined.append(pending + line)
        pending = ""
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in joined]


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for instruction in dockerfile_instructions():
        if instruction[0] == "FROM":
            result.append([])
        result[-1].append(instruction)
    return result


def test_dockerfile_is_multi_stage_and_builds_with_the_script() -> None:
    builder, runtime = stages()
    assert builder[0] == ("FROM", "python:3.11-slim-bookworm AS builder")
    assert runtime[0][1].startswith("python:3.11-slim-bookworm")
    runs = [args for kind, args in builder if kind == "RUN"]
    assert any("build-essential" in run for run in runs)
    assert any(
        run.startswith("bash deploy/docker/build-steps.sh /opt/appbridge/venv") for run in runs
    )
    copies = [args for kind, args in runtime if kind == "COPY"]
    assert "--from=builder /opt/appbridge/venv /opt/appbridge/venv" in copies
    assert not any("build-essential" in args for kind, args in runtime if kind == "RUN")


def test_dockerfile_runtime_is_unprivileged_healthy_and_drains() -> None:
    runtime = dict(stages()[-1])
    user = runtime["USER"].split(":")[0]
    assert user not in ("root", "0")
    assert runtime["STOPSIGNAL"] == "SIGTERM"
    assert "/healthz" in runtime["HEALTHCHECK"] and "CMD" in runtime["HEALTHCHECK"]
    assert "8080/tcp" in runtime["EXPOSE"].split()
    assert yaml.safe_load(runtime["ENTRYPOINT"]) == [
        "appbridge",
        "serve",
        "--config",
        "/etc/appbridge/appbridge.toml",
    ]
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".git", ".venv", "build"} <= set(ignored)


# ---------------------------------------------------------------------- compose.yaml
def compose() -> dict[str, Any]:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def gateway_services() -> dict[str, dict[str, Any]]:
    return {
        name: service
        for name, service in compose()["services"].items()
        if service.get("image", "").startswith("appbridge:")
    }


def mounted_config(service: Mapping[str, Any]) -> Path:
    for volume in service["volumes"]:
        host, container = volume.split(":")[:2]
        if container == "/etc/appbridge/appbridge.toml":
            return (DOCKER / host).resolve()
    raise AssertionError(f"no configuration mounted: {service['volumes']}")


def compose_env() -> dict[str, str]:
    return env_file(DOCKER / ".env.example")


def test_compose_has_two_gateways_kamailio_and_redis() -> None:
    services = compose()["services"]
    gateways = gateway_services()
    assert len(gateways) == 2
    assert {mounted_config(s).name for s in gateways.values()} == set(NODE_CONFIGS)
    assert "kamailio" in services and "redis" in services
    assert "redis-server" in services["redis"]["command"]
    kamailio_mounts = services["kamailio"]["volumes"]
    assert "../kamailio/kamailio.cfg:/etc/kamailio/kamailio.cfg:ro" in kamailio_mounts
    for service in gateways.values():
        assert service["build"]["dockerfile"] == "deploy/docker/Dockerfile"
        assert (DOCKER / service["build"]["context"]).resolve() == REPO


def test_compose_gives_the_drain_time_to_finish() -> None:
    for name, service in gateway_services().items():
        config = load_text(mounted_config(service).read_text(), compose_env())
        assert service["stop_signal"] == "SIGTERM"
        assert seconds(service["stop_grace_period"]) > config.server.drain_timeout_s, name


def test_compose_publishes_each_nodes_own_rtp_range() -> None:
    ranges = []
    for name, service in gateway_services().items():
        config = load_text(mounted_config(service).read_text(), compose_env())
        assert config.sip is not None
        udp = [p for p in service["ports"] if p.endswith("/udp")]
        published = [port_range(p.removesuffix("/udp").split(":")[0]) for p in udp]
        inside = [port_range(p.removesuffix("/udp").split(":")[1]) for p in udp]
        assert config.sip.rtp_ports in published and config.sip.rtp_ports in inside, name
        ranges.append(config.sip.rtp_ports)
    first, second = sorted(ranges)
    assert first[1] < second[0]  # distinct and not overlapping


def test_compose_addresses_agree_with_the_node_configs_and_the_dispatcher() -> None:
    dispatcher = (DOCKER / "dispatcher.list").read_text()
    env = compose_env()
    names: set[str] = set()
    for service in gateway_services().values():
        address = service["networks"]["appbridge"]["ipv4_address"]
        text = mounted_config(service).read_text()
        cluster = tomllib.loads(text)["cluster"]
        assert cluster["internal_url"] == f"http://{address}:8080"
        assert f"sip:{address}:5060 " in dispatcher
        names.add(cluster["node_id"])
        assert refs(text) <= set(env) | set(service["environment"])
    assert len(names) == 2
    redis = compose()["services"]["redis"]["networks"]["appbridge"]["ipv4_address"]
    for service in gateway_services().values():
        assert f"redis://{redis}:6379" in mounted_config(service).read_text()


# ---------------------------------------------------------------------- Kubernetes
def manifests() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(K8S.glob("*.yaml")):
        docs += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return docs


def find(kind: str, name: str) -> dict[str, Any]:
    for doc in manifests():
        if doc["kind"] == kind and doc["metadata"]["name"] == name:
            return doc
    raise AssertionError(f"no {kind} {name}")


def k8s_env(container: Mapping[str, Any]) -> dict[str, str]:
    """The environment Kubernetes gives the gateway container: the Secret example's values, the
    literal ``env`` entries with ``$(NAME)`` expanded, and sample values for the fieldRefs."""
    samples = {"metadata.name": "appbridge-0", "status.hostIP": "10.0.0.21"}
    env = dict(find("Secret", "appbridge-secrets")["stringData"])
    for entry in container["env"]:
        if "value" in entry:
            value = re.sub(r"\$\(([A-Za-z_0-9]+)\)", lambda m: env[m.group(1)], entry["value"])
        else:
            value = samples[entry["valueFrom"]["fieldRef"]["fieldPath"]]
        env[entry["name"]] = value
    return env


def gateway_pod() -> tuple[dict[str, Any], dict[str, Any]]:
    statefulset = find("StatefulSet", "appbridge")
    spec = statefulset["spec"]["template"]["spec"]
    return spec, spec["containers"][0]


def configmap_toml() -> str:
    return str(find("ConfigMap", "appbridge-config")["data"]["appbridge.toml"])


def test_k8s_configmap_is_a_valid_configuration_with_the_pods_environment() -> None:
    _, container = gateway_pod()
    env = k8s_env(container)
    text = configmap_toml()
    assert refs(text) <= set(env), refs(text) - set(env)
    config = load_text(text, env)
    assert config.sip is not None and config.sip.public_address == "10.0.0.21"
    cluster = tomllib.loads(text)["cluster"]
    assert cluster["node_id"] == "${POD_NAME}"  # the StatefulSet's stable pod name
    assert env["APPBRIDGE_INTERNAL_URL"] == "http://10.0.0.21:8080"


def test_k8s_probes_and_stopping_outlast_the_drain() -> None:
    spec, container = gateway_pod()
    drain = load_text(configmap_toml(), k8s_env(container)).server.drain_timeout_s
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    pre_stop = container["lifecycle"]["preStop"]
    assert pre_stop["exec"]["command"][0] == "sleep"
    pre_stop_s = float(pre_stop["exec"]["command"][1])
    assert spec["terminationGracePeriodSeconds"] > drain + pre_stop_s
    assert spec["securityContext"]["runAsNonRoot"] is True


def test_k8s_rtp_reaches_the_pods_on_the_hosts_network() -> None:
    spec, container = gateway_pod()
    assert spec["hostNetwork"] is True
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    anti = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["topologyKey"] == "kubernetes.io/hostname"  # one node per host: its ports
    config = load_text(configmap_toml(), k8s_env(container))
    assert config.sip is not None
    kamailio = find("Deployment", "kamailio")["spec"]["template"]["spec"]
    kamailio_port = kamailio["containers"][0]["ports"][0]["containerPort"]
    sip_ports = {int(entry.rsplit(":", 1)[1]) for entry in config.sip.listen}
    assert kamailio_port not in sip_ports  # both on host networks: they must not collide


def test_k8s_has_http_service_redis_and_kamailio() -> None:
    http = find("Service", "appbridge-http")
    assert http["spec"]["ports"][0]["port"] == 8080
    assert http["spec"]["selector"] == {"app.kubernetes.io/name": "appbridge"}
    find("StatefulSet", "appbridge-redis")
    find("Service", "appbridge-redis")
    assert "appbridge-redis:6379" in configmap_toml()
    dispatcher = find("ConfigMap", "kamailio-dispatcher")["data"]["dispatcher.list"]
    assert "appbridge-0.appbridge-internal:5080" in dispatcher
    assert find("Service", "appbridge-internal")["spec"]["clusterIP"] == "None"
    for doc in manifests():
        assert "namespace" not in doc["metadata"]


# ---------------------------------------------------------------------- systemd
def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(UNIT)
    return parser


def test_systemd_unit_drains_and_restarts() -> None:
    service = unit()["Service"]
    assert service["KillSignal"] == "SIGTERM"
    assert float(service["TimeoutStopSec"]) > 30.0  # the default server.drain_timeout_s
    command = shlex.split(service["ExecStart"])
    assert Path(command[0]).name == "appbridge" and command[1] == "serve"
    assert service["Restart"] == "on-failure"
    assert service["User"] == "appbridge"
    assert service["NoNewPrivileges"] == "yes" and service["ProtectSystem"] == "strict"
    assert "ReadWritePaths" in service
    assert "AmbientCapabilities" not in service  # 5060 and 8080 need no capability
    example = env_file(DEPLOY / "systemd" / "appbridge.env.example")
    assert "APPBRIDGE_API_TOKEN" in example


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze missing")
    # verify checks that ExecStart exists: point it at this environment's appbridge.
    here = Path(sys.executable).parent / "appbridge"
    if not here.exists():
        pytest.skip(f"{here} missing")
    text = UNIT.read_text().replace("/opt/appbridge/venv/bin/appbridge", str(here))
    copy = tmp_path / "appbridge.service"
    copy.write_text(text)
    result = subprocess.run(
        [analyze, "verify", str(copy)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------------- the build, for real
def tracked_tree(destination: Path) -> Path:
    """A copy of the files git tracks, as they are in the work tree (a ``git archive`` of it)."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, listed):
        source = REPO / os.fsdecode(name)
        if source.is_file():
            target = destination / os.fsdecode(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return destination


@pytest.mark.timeout(1200)
def test_build_steps_make_a_compiled_venv_that_checks_the_node_configs(tmp_path: Path) -> None:
    """What the Dockerfile's builder stage runs, into a fresh venv from a clean copy of the
    tree: the deps, the one mypyc build, ``python -m appbridge.compiled``; then the built
    ``appbridge check-config`` accepts the example node configs. The C is compiled at -O0
    (``APPBRIDGE_MYPYC_OPT``, setup.py): the steps are what is checked here, and the image's
    own build keeps the default -O3."""
    if shutil.which("git") is None or shutil.which("cc") is None:
        reason = "the build needs git and a C compiler, as `make install` does"
        if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    src = tracked_tree(tmp_path / "src")
    venv = tmp_path / "venv"
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("PYTHONPATH", None)
    build_env = {**env, "APPBRIDGE_MYPYC_OPT": "0"}
    build = subprocess.run(
        ["bash", str(src / "deploy/docker/build-steps.sh"), str(venv), str(src)],
        capture_output=True,
        text=True,
        env=build_env,
        timeout=1100,
    )
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    check = subprocess.run(
        [str(venv / "bin/python"), "-m", "appbridge.compiled"],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        timeout=60,
    )
    assert check.returncode == 0, check.stderr
    run_env = {**env, **compose_env()}
    for name in NODE_CONFIGS:
        text = (DOCKER / name).read_text()
        path = tmp_path / name
        path.write_text(text if loader_knows_cluster() else without_cluster(text))
        result = subprocess.run(
            [str(venv / "bin/appbridge"), "check-config", str(path)],
            capture_output=True,
            text=True,
            env=run_env,
            cwd="/",
            timeout=60,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.startswith(f"OK: {path}")
    where = subprocess.run(
        [str(venv / "bin/python"), "-c", "import appbridge; print(appbridge.__file__)"],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        timeout=60,
    ).stdout
    assert where.startswith(str(venv))  # the built copy ran, not this tree


def test_node_addresses_are_private() -> None:
    for name in NODE_CONFIGS:
        cluster = tomllib.loads((DOCKER / name).read_text())["cluster"]
        host = cluster["internal_url"].split("//")[1].split(":")[0]
        assert ipaddress.ip_address(host).is_private
