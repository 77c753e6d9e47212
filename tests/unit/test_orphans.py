"""What the operator does with a content being deleted whose node or agent may be gone (operator/orphans.py)."""

from __future__ import annotations

from podsnap.operator.orphans import Decision, decide, pick

LIVE = ["node-a", "node-c"]


def test_a_node_with_a_running_agent_keeps_its_cleanup() -> None:
    got = decide(name="x", node="node-a", node_exists=True, agent_on_node=True, live=LIVE, waited_s=9e9, wait_s=600)
    assert got == Decision()


def test_a_gone_node_is_handed_over_at_once_to_another_live_agent() -> None:
    got = decide(name="x", node="node-b", node_exists=False, agent_on_node=False, live=LIVE, waited_s=0, wait_s=600)
    assert got.to in LIVE and not got.release and "node node-b is gone" in got.why


def on_node_b(*, exists: bool, live: list[str], waited_s: float) -> Decision:
    return decide(
        name="x", node="node-b", node_exists=exists, agent_on_node=False, live=live, waited_s=waited_s, wait_s=600
    )


def test_a_node_without_a_running_agent_waits_then_is_handed_over() -> None:
    assert on_node_b(exists=True, live=LIVE, waited_s=599) == Decision()
    got = on_node_b(exists=True, live=LIVE, waited_s=600)
    assert got.to in LIVE and "no running agent for 600 s" in got.why


def test_without_any_live_agent_the_content_is_released_only_after_the_wait() -> None:
    assert on_node_b(exists=False, live=[], waited_s=10) == Decision()
    got = on_node_b(exists=False, live=[], waited_s=700)
    assert got.release and got.to is None and "no node has a running agent" in got.why


def test_the_node_it_leaves_is_never_the_one_it_goes_to() -> None:
    got = decide(
        name="x", node="node-a", node_exists=True, agent_on_node=False, live=["node-a"], waited_s=700, wait_s=600
    )
    assert got.release  # node-a's agent is not Ready: no one else to hand to


def test_pick_is_stable_and_spreads() -> None:
    nodes = [f"n{i}" for i in range(8)]
    assert pick("content-1", nodes) == pick("content-1", list(reversed(nodes)))
    assert len({pick(f"content-{i}", nodes) for i in range(64)}) > 4
