"""What the operator does with a content being deleted whose node or agent may be gone (operator/orphans.py)."""

from __future__ import annotations

import datetime

from podsnap.operator.agent_absence import Agents, absences, since
from podsnap.operator.orphans import Decision, decide, pick
from podsnap.operator.stale_placement import stale

LIVE = ["node-a", "node-c"]


def test_a_node_with_a_running_agent_keeps_its_cleanup() -> None:
    got = decide(name="x", node="node-a", node_exists=True, agent_on_node=True, live=LIVE, absent_s=9e9, wait_s=600)
    assert got == Decision()
    # even if its Node object is gone: a Ready agent there may still be removing the artifact
    got = decide(name="x", node="node-a", node_exists=False, agent_on_node=True, live=LIVE, absent_s=0, wait_s=600)
    assert got == Decision()


def test_a_gone_node_is_handed_over_at_once_to_another_live_agent() -> None:
    got = decide(name="x", node="node-b", node_exists=False, agent_on_node=False, live=LIVE, absent_s=0, wait_s=600)
    assert got.to in LIVE and not got.release and "node node-b is gone" in got.why


def on_node_b(*, exists: bool, live: list[str], absent_s: float) -> Decision:
    return decide(
        name="x", node="node-b", node_exists=exists, agent_on_node=False, live=live, absent_s=absent_s, wait_s=600
    )


def test_a_node_without_a_running_agent_waits_then_is_handed_over() -> None:
    assert on_node_b(exists=True, live=LIVE, absent_s=599) == Decision()
    got = on_node_b(exists=True, live=LIVE, absent_s=600)
    assert got.to in LIVE and "no running agent for 600 s" in got.why


def test_without_any_live_agent_the_content_is_released_only_after_the_wait() -> None:
    assert on_node_b(exists=False, live=[], absent_s=10) == Decision()
    got = on_node_b(exists=False, live=[], absent_s=700)
    assert got.release and got.to is None and "no node has a running agent" in got.why


def test_the_node_it_leaves_is_never_the_one_it_goes_to() -> None:
    got = decide(
        name="x", node="node-a", node_exists=True, agent_on_node=False, live=["node-a"], absent_s=700, wait_s=600
    )
    assert got.release  # node-a's agent is not Ready: no one else to hand to


def test_pick_is_stable_and_spreads() -> None:
    nodes = [f"n{i}" for i in range(8)]
    assert pick("content-1", nodes) == pick("content-1", list(reversed(nodes)))
    assert len({pick(f"content-{i}", nodes) for i in range(64)}) > 4


T0 = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)
NOW = T0 + datetime.timedelta(hours=1)


def test_an_absence_is_recorded_once_from_the_earliest_known_time_and_dropped_when_an_agent_is_ready() -> None:
    agents = Agents(
        ready=frozenset({"node-a"}),
        present=frozenset({"node-a", "node-c"}),
        not_ready_since={"node-c": T0},  # its kubelet's lastTransitionTime
    )
    got = absences({"node-a": T0, "node-b": T0}, agents, ["node-a", "node-b", "node-c", "node-d"], NOW)
    # node-a's agent is Ready again: dropped; node-b keeps its first time; node-c's pod says since when;
    # node-d is first seen without one now
    assert got == {"node-b": T0, "node-c": T0, "node-d": NOW}
    assert absences(got, agents, ["node-b"], NOW + datetime.timedelta(hours=1)) == {"node-b": T0}


def test_the_wait_counts_from_the_absence_and_is_zero_while_an_agent_is_ready() -> None:
    agents = Agents(ready=frozenset({"node-a"}), present=frozenset({"node-a"}))
    assert since("node-a", agents, {"node-a": T0}, NOW) == NOW  # a stale entry never counts against a Ready agent
    assert since("node-b", agents, {"node-b": T0}, NOW) == T0
    assert since("node-c", agents, {}, NOW) == NOW  # not recorded yet: the wait has not begun


def labelled(name: str) -> dict[str, object]:
    return {"metadata": {"name": name, "labels": {"podsnap.io/arch": "x86_64"}}}


def test_placement_labels_go_only_from_nodes_without_an_agent_pod_after_the_wait() -> None:
    agents = Agents(present=frozenset({"node-a"}), not_ready_since={"node-a": T0})
    nodes = [labelled("node-a"), labelled("node-b"), labelled("node-c"), labelled("node-d")]
    absent = {"node-a": T0, "node-b": T0, "node-c": NOW - datetime.timedelta(seconds=599)}
    # node-a: its pod exists (not Ready, it relabels when it runs); node-c: not long enough; node-d: not recorded
    assert [n["metadata"]["name"] for n in stale(nodes, agents, absent, NOW, 600)] == ["node-b"]
