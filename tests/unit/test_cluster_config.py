"""``[cluster]`` (docs/configuration.md): absent means one node; every key is checked."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping

import pytest

from appbridge.config import Config, ConfigError, parse_config
from appbridge.config.model import ClusterConfig

BASE = (
    '[[apps]]\nref = "a"\nurl = "wss://app.example.com/s"\n[[numbers]]\nnumber = "*"\napp = "a"\n'
)
GOOD = (
    '[cluster]\nnode_id = "node-a"\nredis_url = "redis://127.0.0.1:6379/0"\n'
    'internal_url = "http://10.0.0.11:8080"\nsecret = "${APPBRIDGE_CLUSTER_SECRET}"\n'
)
ENV = {"APPBRIDGE_CLUSTER_SECRET": "s3cret"}


def parse(text: str, env: Mapping[str, str] | None = None) -> Config:
    return parse_config(tomllib.loads(text), env or ENV, source="test.toml")


def problems(text: str, env: Mapping[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse(text, env)
    return info.value.problems


def test_absent_section_is_one_node() -> None:
    assert parse(BASE).cluster is None


def test_the_documented_section_reads() -> None:
    assert parse(BASE + GOOD).cluster == ClusterConfig(
        node_id="node-a",
        redis_url="redis://127.0.0.1:6379/0",
        internal_url="http://10.0.0.11:8080",
        secret="s3cret",
    )


def test_rediss_and_https_are_accepted() -> None:
    text = GOOD.replace("redis://", "rediss://").replace("http://10", "https://10")
    cluster = parse(BASE + text).cluster
    assert cluster is not None
    assert cluster.redis_url.startswith("rediss://")
    assert cluster.internal_url.startswith("https://")


def test_secrets_are_not_in_repr() -> None:
    cluster = parse(BASE + GOOD).cluster
    assert "s3cret" not in repr(cluster)
    assert "6379" not in repr(cluster)


@pytest.mark.parametrize(
    ("old", "new", "problem"),
    [
        ('"node-a"', '"node a"', "cluster.node_id: expected 1-64 characters"),
        ('"node-a"', '"' + "n" * 65 + '"', "cluster.node_id: expected 1-64 characters"),
        ('"node-a"', '"nöde"', "cluster.node_id: expected 1-64 characters"),
        ('"node-a"', '""', "cluster.node_id: must not be empty"),
        ('"redis://127.0.0.1:6379/0"', '"http://127.0.0.1:6379"', "cluster.redis_url: expected"),
        ('"redis://127.0.0.1:6379/0"', '"redis://"', "cluster.redis_url: expected"),
        ('"http://10.0.0.11:8080"', '"ws://10.0.0.11:8080"', "cluster.internal_url: expected"),
        ('"http://10.0.0.11:8080"', '"http://10.0.0.11:8080/"', "cluster.internal_url: must not"),
        ('"http://10.0.0.11:8080"', "8080", "cluster.internal_url: expected a string"),
    ],
)
def test_bad_values_are_reported_at_their_path(old: str, new: str, problem: str) -> None:
    found = problems(BASE + GOOD.replace(old, new))
    assert len(found) == 1
    assert found[0].startswith(problem), found


def test_empty_secret_is_refused() -> None:
    assert problems(BASE + GOOD, {"APPBRIDGE_CLUSTER_SECRET": ""}) == [
        "cluster.secret: must not be empty"
    ]


def test_every_key_is_required() -> None:
    found = problems(BASE + "[cluster]\n")
    assert sorted(found) == [
        f"cluster.{key}: missing (required)"
        for key in ("internal_url", "node_id", "redis_url", "secret")
    ]


def test_unknown_key_is_refused() -> None:
    assert problems(BASE + GOOD + "ttl_s = 3\n") == ["cluster.ttl_s: unknown key"]
