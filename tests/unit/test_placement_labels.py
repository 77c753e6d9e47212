"""The label-safe form of the facts restore pods are placed by (podsnap.kube.placement_labels), the node
affinity the webhook merges into a pod's own, and the sentence a pod that no node can take carries."""

from __future__ import annotations

import re
from typing import Any

import pytest

from podsnap import contract as c
from podsnap.kube.placement_labels import Requirement, label_value, node_labels, requirements
from podsnap.operator.placement import unmatched, with_required

#: what the API server accepts as a label value (apimachinery validation.IsValidLabelValue)
VALID = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
H200 = {"name": "NVIDIA H200", "uuid": "GPU-1"}


@pytest.mark.parametrize("fact", ["x86_64", "6.1.0-test", "580.159.04", "aarch64", "5.15.0-1048-aws"])
def test_a_fact_that_is_a_valid_label_value_is_its_own_value(fact: str) -> None:
    assert label_value(fact) == fact


@pytest.mark.parametrize(
    "fact",
    [
        "NVIDIA H200",
        "NVIDIA A100-SXM4-80GB",
        "6.6.0+",
        "-leading-dash",
        "trailing.dot.",
        "4.18.0-513.el8.x86_64+debug #1 SMP",
        "x" * 64,
        "GPU model with ünïcode",
        "+++",
    ],
)
def test_any_other_fact_becomes_a_valid_value_with_a_short_hash(fact: str) -> None:
    value = label_value(fact)
    assert VALID.match(value) and len(value) <= 63, value
    assert label_value(fact) == value  # deterministic
    assert re.search(r"[0-9a-f]{10}$", value), value


def test_facts_that_differ_only_in_replaced_characters_get_different_values() -> None:
    values = {label_value(f) for f in ("NVIDIA H200", "NVIDIA_H200 ", "NVIDIA+H200", "NVIDIA  H200")}
    assert len(values) == 4
    assert label_value("NVIDIA H200").startswith("NVIDIA_H200-")  # still readable in `kubectl get nodes -L`
    long_a, long_b = "k" * 70 + "a", "k" * 70 + "b"
    assert label_value(long_a) != label_value(long_b)


def test_a_node_is_labelled_with_every_gate_fact_and_null_for_those_it_lacks() -> None:
    gpu_node = {"arch": "x86_64", "kernel": "6.6.0+", "driver": "580.159.04", "gpus": [H200, H200]}
    assert node_labels(gpu_node) == {
        c.LABEL_NODE_ARCH: "x86_64",
        c.LABEL_NODE_KERNEL: label_value("6.6.0+"),
        c.LABEL_NODE_DRIVER: "580.159.04",
        c.LABEL_NODE_GPU_PRODUCT: label_value("NVIDIA H200"),
        c.LABEL_NODE_GPU_COUNT: "2",
    }
    cpu_node = node_labels({"arch": "aarch64", "kernel": "6.1.0", "driver": "", "gpus": []})
    assert cpu_node[c.LABEL_NODE_ARCH] == "aarch64"
    # null removes a label that stopped being true (the merge patch the agent sends)
    assert cpu_node[c.LABEL_NODE_DRIVER] is None and cpu_node[c.LABEL_NODE_GPU_PRODUCT] is None
    assert cpu_node[c.LABEL_NODE_GPU_COUNT] is None
    assert set(cpu_node) == set(c.NODE_FACT_LABELS)


def test_a_node_with_several_gpu_models_is_labelled_with_all_of_them() -> None:
    mixed = node_labels({"gpus": [{"name": "NVIDIA L4"}, H200, {"name": "NVIDIA L4"}]})
    assert mixed[c.LABEL_NODE_GPU_PRODUCT] == label_value("NVIDIA H200+NVIDIA L4")
    assert mixed[c.LABEL_NODE_GPU_COUNT] == "3"


def test_a_cpu_checkpoint_requires_arch_and_kernel_only() -> None:
    source = {"arch": "x86_64", "kernel": "6.1.0-test", "driver": "580.159.04", "gpus": [H200], "cudaGpus": []}
    got = requirements(source)
    assert [(r.label, r.operator, r.value) for r in got] == [
        (c.LABEL_NODE_ARCH, "In", "x86_64"),
        (c.LABEL_NODE_KERNEL, "In", "6.1.0-test"),
    ]


def test_a_gpu_checkpoint_requires_driver_models_and_count() -> None:
    source = {"arch": "x86_64", "kernel": "6.1.0", "driver": "580.159.04", "cudaGpus": ["NVIDIA H200"] * 2}
    got = {r.label: r for r in requirements(source)}
    assert got[c.LABEL_NODE_DRIVER].value == "580.159.04"
    assert got[c.LABEL_NODE_GPU_PRODUCT].value == label_value("NVIDIA H200")
    assert (got[c.LABEL_NODE_GPU_COUNT].operator, got[c.LABEL_NODE_GPU_COUNT].value) == ("Gt", "1")
    # the node that captured it carries exactly what it requires
    node = node_labels({"arch": "x86_64", "kernel": "6.1.0", "driver": "580.159.04", "gpus": [H200, H200]})
    labels = {k: v for k, v in node.items() if v is not None}
    assert all(r.matches(labels) for r in got.values())
    assert not got[c.LABEL_NODE_GPU_COUNT].matches({**labels, c.LABEL_NODE_GPU_COUNT: "1"})
    assert not got[c.LABEL_NODE_DRIVER].matches({**labels, c.LABEL_NODE_DRIVER: "570.86.15"})
    # one GPU: no count beyond having the model
    assert c.LABEL_NODE_GPU_COUNT not in {r.label for r in requirements({**source, "cudaGpus": ["NVIDIA H200"]})}


def test_an_artifact_without_recorded_facts_requires_nothing() -> None:
    assert requirements({}) == []


def test_the_placement_affinity_is_anded_into_every_term_the_user_wrote() -> None:
    ours = [{"key": c.LABEL_NODE_KERNEL, "operator": "In", "values": ["6.1.0-test"]}]
    zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
    name = {"key": "metadata.name", "operator": "In", "values": ["n1"]}
    preferred = [{"weight": 1, "preference": {"matchExpressions": [zone]}}]
    affinity: dict[str, Any] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [zone]}, {"matchFields": [name]}]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": preferred,
        },
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []},
    }
    merged = with_required(affinity, ours)
    terms = merged["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [zone, *ours]}, {"matchFields": [name], "matchExpressions": ours}]
    assert merged["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == preferred
    assert merged["podAntiAffinity"] == affinity["podAntiAffinity"]
    # the pod's own affinity is not changed in place
    assert affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0] == {
        "matchExpressions": [zone]
    }
    fresh = with_required(None, ours)
    assert fresh == {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": ours}]}
        }
    }


def _node(labels: dict[str, str], *, ready: bool = True, cordoned: bool = False, name: str = "n") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"unschedulable": cordoned},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_the_message_names_the_facts_no_ready_node_has() -> None:
    required = [
        Requirement(c.LABEL_NODE_ARCH, "In", "x86_64", "arch", "x86_64"),
        Requirement(c.LABEL_NODE_KERNEL, "In", "6.9.0", "kernel", "6.9.0"),
    ]
    good = {c.LABEL_NODE_ARCH: "x86_64", c.LABEL_NODE_KERNEL: "6.9.0"}
    assert unmatched(required, [_node(good)]) == ""
    other = {c.LABEL_NODE_ARCH: "x86_64", c.LABEL_NODE_KERNEL: "6.1.0"}
    message = unmatched(required, [_node(other), _node(good, ready=False), _node(good, cordoned=True)])
    assert message.startswith("no Ready node has the checkpoint's kernel 6.9.0"), message
    assert f"{c.LABEL_NODE_KERNEL}=6.9.0" in message and "arch" not in message.split("(")[0]
    split = [_node({c.LABEL_NODE_ARCH: "x86_64"}), _node({c.LABEL_NODE_KERNEL: "6.9.0"})]
    assert unmatched(required, split).startswith("no single Ready node has all of the checkpoint's arch x86_64")


def test_a_node_the_pods_own_selector_or_affinity_excludes_does_not_count() -> None:
    """A Deployment pinned to a pool where no node has the checkpoint's facts must start cold under ColdStart:
    the facts ANDed into its own terms could never be scheduled, so such nodes are not a match."""
    required = [Requirement(c.LABEL_NODE_KERNEL, "In", "6.9.0", "kernel", "6.9.0")]
    pool_a = _node({c.LABEL_NODE_KERNEL: "6.9.0", "pool": "a"}, name="a-1")
    pool_b = _node({c.LABEL_NODE_KERNEL: "6.1.0", "pool": "b"}, name="b-1")
    assert unmatched(required, [pool_a, pool_b]) == ""
    assert unmatched(required, [pool_a, pool_b], {"nodeSelector": {"pool": "a"}}) == ""
    message = unmatched(required, [pool_a, pool_b], {"nodeSelector": {"pool": "b"}})
    assert message.startswith("no Ready node has the checkpoint's kernel 6.9.0"), message
    assert "that the pod's own nodeSelector and node affinity allow (1 excluded)" in message

    def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
        return {
            "affinity": {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}
            }
        }

    def expr(key: str, op: str, *values: str) -> dict[str, Any]:
        return {"key": key, "operator": op, **({"values": list(values)} if values else {})}

    # the scheduler's operators; the terms are ORed, the expressions of one term ANDed
    assert unmatched(required, [pool_a], affinity({"matchExpressions": [expr("pool", "NotIn", "a")]}))
    assert not unmatched(required, [pool_a], affinity({"matchExpressions": [expr("pool", "In", "a", "c")]}))
    assert unmatched(required, [pool_a], affinity({"matchExpressions": [expr("gpu", "Exists")]}))
    assert not unmatched(required, [pool_a], affinity({"matchExpressions": [expr("gpu", "DoesNotExist")]}))
    assert not unmatched(
        required,
        [pool_a],
        affinity(
            {"matchExpressions": [expr("pool", "In", "b")]}, {"matchFields": [expr("metadata.name", "In", "a-1")]}
        ),
    )
    assert unmatched(required, [pool_a], affinity({"matchFields": [expr("metadata.name", "NotIn", "a-1")]}))
    assert unmatched(required, [pool_a], affinity({}))  # an empty term matches no node
    numbered = _node({c.LABEL_NODE_KERNEL: "6.9.0", "rack": "7"}, name="r")
    assert not unmatched(required, [numbered], affinity({"matchExpressions": [expr("rack", "Gt", "5")]}))
    assert unmatched(required, [numbered], affinity({"matchExpressions": [expr("rack", "Lt", "5")]}))
