"""Membership timing and placement, in virtual time and without I/O (docs/scaling.md,
"Membership", "Placing a call")."""

from __future__ import annotations

from appbridge.clock import VirtualClock
from appbridge.cluster.membership import (
    HEARTBEAT_S,
    NODE_TTL_S,
    RETRY_S,
    HeartbeatSchedule,
    NodeInfo,
    choose_node,
    parse_node,
)
from appbridge.cluster.redis_link import REDIS_TIMEOUT_S


def test_the_bounds_of_the_outside_rule_hold() -> None:
    # A heartbeat at most every 5 s; gone at most 15 s after the last one. A node survives one
    # lost heartbeat plus a slow Redis without flapping.
    assert HEARTBEAT_S <= 5.0
    assert NODE_TTL_S <= 15
    assert NODE_TTL_S >= 2 * HEARTBEAT_S + REDIS_TIMEOUT_S


def beats(
    schedule: HeartbeatSchedule, clock: VirtualClock, until: float, draining: bool
) -> list[float]:
    seen = []
    while clock.now() < until:
        if schedule.due(clock.now(), draining):
            schedule.sent(clock.now(), draining)
            seen.append(round(clock.now() - 1000.0, 3))
        clock.advance(0.25)
    return seen


def test_heartbeats_every_interval() -> None:
    clock = VirtualClock()
    schedule = HeartbeatSchedule()
    assert beats(schedule, clock, 1007.0, False) == [0.0, 2.0, 4.0, 6.0]


def test_draining_is_announced_at_once_not_at_the_next_beat() -> None:
    clock = VirtualClock()
    schedule = HeartbeatSchedule()
    beats(schedule, clock, 1000.5, False)
    assert schedule.due(clock.now(), True)
    schedule.sent(clock.now(), True)
    assert not schedule.due(clock.now() + 0.25, True)
    assert schedule.due(clock.now() + HEARTBEAT_S, True)


def test_a_failed_heartbeat_is_retried_after_the_retry_delay_even_while_draining() -> None:
    clock = VirtualClock()
    schedule = HeartbeatSchedule()
    schedule.failed(clock.now())
    assert not schedule.due(clock.now() + RETRY_S - 0.01, True)
    assert schedule.due(clock.now() + RETRY_S, False)


def node(node_id: str, max_calls: int, live: int, draining: bool = False) -> NodeInfo:
    return NodeInfo(node_id, f"http://{node_id}:8080", max_calls, live, draining)


def test_placement_takes_the_most_free_capacity() -> None:
    nodes = [node("a", 10, 9), node("b", 10, 2), node("c", 20, 15)]
    assert choose_node(nodes, "a", 1) == "b"


def test_placement_ties_go_to_self_then_the_lowest_id() -> None:
    nodes = [node("a", 10, 5), node("b", 10, 5), node("c", 10, 5)]
    assert choose_node(nodes, "b", 5) == "b"
    assert choose_node([node("c", 10, 2), node("b", 10, 2)], "a", 1) == "b"


def test_placement_skips_draining_nodes_including_self() -> None:
    nodes = [node("a", 10, 0), node("b", 10, 9, draining=True), node("c", 10, 8)]
    assert choose_node(nodes, "a", 10, self_draining=True) == "c"
    assert choose_node([node("b", 10, 0, draining=True)], "a", 0) == "a"
    assert choose_node([], "a", 0, self_draining=True) == "a"


def test_a_node_hash_is_read_back_or_refused() -> None:
    fields = {"node_id": "a", "internal_url": "http://x", "max_calls": "7", "live": "3"}
    assert parse_node(fields, None) == NodeInfo("a", "http://x", 7, 3, False)
    assert parse_node({**fields, "draining": "1"}, 5) == NodeInfo("a", "http://x", 7, 5, True)
    assert parse_node({}, 0) is None
    assert parse_node({**fields, "max_calls": "x"}, 0) is None
