"""Lint and render the chart: every ci/ scenario, every object valid for Kubernetes 1.27 and 1.37,
and the properties the design asks of each object."""

from __future__ import annotations

import hashlib
import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from podsnap import contract
from podsnap.operator.agent_absence import ABSENCE_CONFIGMAP
from tests.chart.conftest import (
    CHART,
    FIGURES,
    NAMESPACE,
    REPO,
    SCENARIOS,
    Doc,
    Docs,
    container,
    env_of,
    find,
    kinds,
    parallel,
    render,
    render_error,
    run,
    scenario_file,
)

K8S_VERSIONS = ("1.27.0", "1.37.0")
#: kinds from other projects' CRDs: kubernetes-validate has no schema, checked by the tests below
FOREIGN_KINDS = {"Certificate", "Issuer", "ServiceMonitor"}


@pytest.mark.parametrize("binary", ["helm3", "helm"])
def test_helm_lint_strict_passes_for_every_scenario(binary: str, request: pytest.FixtureRequest) -> None:
    helm: str = request.getfixturevalue(binary)

    def lint(name: str) -> subprocess.CompletedProcess[str]:
        return run(
            [helm, "lint", "--strict", str(CHART), "--namespace", NAMESPACE, "-f", str(scenario_file(name))],
            check=False,
        )

    for name, proc in zip(SCENARIOS, parallel(lint, SCENARIOS), strict=True):
        assert proc.returncode == 0, f"{binary} lint --strict -f ci/{name}-values.yaml:\n{proc.stdout}\n{proc.stderr}"


def test_every_scenario_renders_the_expected_objects(matrix: dict[str, Docs]) -> None:
    assert len(SCENARIOS) >= 8
    base = kinds(matrix["default"])
    assert base == sorted(
        ["CustomResourceDefinition"] * 4
        + ["ClusterRole", "ClusterRoleBinding", "ServiceAccount"] * 2
        + ["ClusterRole"] * 2  # aggregated into view and edit
        + ["Role", "RoleBinding"]  # the operator's one ConfigMap in its namespace (operator/agent_absence.py)
        + ["ConfigMap", "DaemonSet", "Deployment", "MutatingWebhookConfiguration", "PersistentVolumeClaim"]
        + ["Secret", "Secret", "Service", "Service", "Service", "ValidatingWebhookConfiguration"]
    )
    assert "PersistentVolumeClaim" not in kinds(matrix["existing-claim"])
    assert "CustomResourceDefinition" not in kinds(matrix["no-crds"])
    assert kinds(matrix["service-monitor"]).count("ServiceMonitor") == 1
    cm_secrets = [d["metadata"]["name"] for d in matrix["cert-manager"] if d["kind"] == "Secret"]
    assert cm_secrets == ["podsnap-token-key"] and "Certificate" in kinds(matrix["cert-manager"])
    assert "Issuer" not in kinds(matrix["cert-manager"]) and "Issuer" in kinds(matrix["cert-manager-selfsigned"])
    minimal = kinds(matrix["minimal"])
    webhooks = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
    for kind in (*webhooks, "Service", "ConfigMap", "ServiceAccount"):
        assert kind not in minimal
    # the one Secret left is the pod-token key, which is not optional (tests/chart/test_security.py)
    assert [d["metadata"]["name"] for d in matrix["minimal"] if d["kind"] == "Secret"] == ["podsnap-token-key"]


def test_helm3_renders_every_scenario_like_helm4(helm3: str, matrix: dict[str, Docs]) -> None:
    from tests.chart.conftest import render

    rendered = parallel(lambda n: render(helm3, "-f", str(scenario_file(n))), SCENARIOS)
    for name, docs in zip(SCENARIOS, rendered, strict=True):
        assert kinds(docs) == kinds(matrix[name]), name


def unique_docs(matrix: dict[str, Docs]) -> list[tuple[str, Doc]]:
    seen: dict[str, tuple[str, Doc]] = {}
    for name, docs in matrix.items():
        for doc in docs:
            seen.setdefault(json.dumps(doc, sort_keys=True), (name, doc))
    return list(seen.values())


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_rendered_object_passes_kubernetes_validate_strict(version: str, matrix: dict[str, Docs]) -> None:
    start = time.monotonic()
    failures, foreign = [], set()
    docs = unique_docs(matrix)
    for scenario, doc in docs:
        if doc["kind"] in FOREIGN_KINDS:
            foreign.add(doc["kind"])
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            failures.append(f"{scenario}: {doc['kind']}/{doc['metadata']['name']}: {exc}")
    assert not failures, "\n".join(failures)
    assert foreign == FOREIGN_KINDS
    FIGURES[f"kubernetes-validate --strict {version}"] = (
        f"{len(docs) - sum(d['kind'] in FOREIGN_KINDS for _, d in docs)} distinct objects in "
        f"{time.monotonic() - start:.2f} s (no schema, checked by tests: {', '.join(sorted(foreign))})"
    )


def labels_of(doc: Doc) -> dict[str, str]:
    return dict(doc["metadata"].get("labels") or {})


def test_selectors_use_only_stable_labels(default_docs: Docs) -> None:
    for kind, name, component in (
        ("Deployment", "podsnap-operator", "operator"),
        ("DaemonSet", "podsnap-agent", "agent"),
    ):
        doc = find(default_docs, kind, name)
        selector = doc["spec"]["selector"]["matchLabels"]
        assert selector == {
            "app.kubernetes.io/name": "podsnap",
            "app.kubernetes.io/instance": "podsnap",
            "app.kubernetes.io/component": component,
        }
        pod_labels = doc["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= pod_labels.items()
        assert "helm.sh/chart" in labels_of(doc) and "app.kubernetes.io/version" in labels_of(doc)
    for svc in (d for d in default_docs if d["kind"] == "Service"):
        assert "app.kubernetes.io/version" not in svc["spec"]["selector"]
        assert "helm.sh/chart" not in svc["spec"]["selector"]


def test_every_object_is_labelled_and_namespaced(default_docs: Docs, matrix: dict[str, Docs]) -> None:
    cluster_scoped = {
        "CustomResourceDefinition",
        "ClusterRole",
        "ClusterRoleBinding",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    }
    for doc in default_docs:
        assert labels_of(doc)["app.kubernetes.io/part-of"] == "podsnap", doc["kind"]
        if doc["kind"] in cluster_scoped:
            assert "namespace" not in doc["metadata"]
        else:
            assert doc["metadata"]["namespace"] == NAMESPACE, doc["kind"]
        assert len(doc["metadata"]["name"]) <= 63 or doc["kind"] == "CustomResourceDefinition"
    for doc in matrix["overrides"]:
        assert labels_of(doc)["team"] == "ml-platform", doc["kind"]
        assert (
            doc["metadata"]["name"].startswith(("snap", "gpu-checkpoints")) or doc["kind"] == "CustomResourceDefinition"
        )


def test_operator_is_unprivileged_with_probes_and_ports(default_docs: Docs) -> None:
    deploy = find(default_docs, "Deployment", "podsnap-operator")
    spec = deploy["spec"]["template"]["spec"]
    assert deploy["spec"]["replicas"] == 1 and deploy["spec"]["strategy"]["type"] == "Recreate"
    assert spec["serviceAccountName"] == "podsnap-operator"
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
    assert not spec.get("hostPID") and not spec.get("hostNetwork")
    op = container(deploy, "operator")
    assert op["command"] == ["podsnap-operator"]
    # podsnap publishes no images: without image.registry `helm template` renders the bare name
    assert op["image"] == "podsnap-operator:0.1.0"
    sc = op["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and not sc.get("privileged")
    ports = {p["name"]: p["containerPort"] for p in op["ports"]}
    assert ports == {"health": 8081, "metrics": 8080, "webhook": 9443}
    assert op["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert op["readinessProbe"]["httpGet"]["port"] == "health"
    mounts = {m["mountPath"]: m["name"] for m in op["volumeMounts"]}
    assert mounts == {
        "/tmp": "tmp",
        contract.WEBHOOK_CERT_DIR_DEFAULT: "webhook-tls",
        contract.TOKEN_KEY_DIR_DEFAULT: "token-key",
    }
    env = env_of(op)
    assert env[contract.ENV_WEBHOOK_CERT_DIR] == contract.WEBHOOK_CERT_DIR_DEFAULT
    assert env[contract.ENV_WEBHOOK_PORT] == "9443" and env[contract.ENV_WEBHOOK_PATH] == "/mutate-pods"
    assert env[contract.ENV_SECCOMP_PROFILE] == "podsnap/capture-v2.json"


def test_agent_is_privileged_host_pid_on_gpu_nodes(default_docs: Docs) -> None:
    ds = find(default_docs, "DaemonSet", "podsnap-agent")
    spec = ds["spec"]["template"]["spec"]
    assert spec["hostPID"] is True
    assert spec["serviceAccountName"] == "podsnap-agent"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["priorityClassName"] == "system-node-critical"
    assert "runtimeClassName" not in spec
    agent = container(ds, "agent")
    assert agent["command"] == ["podsnap-agent"] and agent["securityContext"]["privileged"] is True
    env = env_of(agent)
    assert env[contract.ENV_NODE_NAME] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env[contract.ENV_ARTIFACT_ROOT] == contract.ARTIFACT_ROOT_DEFAULT
    assert env[contract.ENV_CGROUP_ROOT] == contract.CGROUP_ROOT_IN_AGENT
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in agent["volumeMounts"]}
    assert mounts["artifacts"] == contract.ARTIFACT_ROOT_DEFAULT
    assert volumes["artifacts"]["persistentVolumeClaim"] == {"claimName": "podsnap-artifacts"}
    # the agent container mounts only what it uses: the claim, the host's cgroups, its node cache and its
    # node-local state (the seccomp dir is the init container's)
    host_paths = {v["hostPath"]["path"]: mounts.get(n) for n, v in volumes.items() if "hostPath" in v}
    assert host_paths == {
        "/sys/fs/cgroup": contract.CGROUP_ROOT_IN_AGENT,
        "/var/lib/kubelet/seccomp": None,
        "/var/lib/kubelet/podsnap/artifact-cache": contract.CACHE_DIR_IN_AGENT,
        "/var/lib/kubelet/podsnap/agent-state": contract.STATE_DIR_IN_AGENT,
    }


def test_the_agent_is_given_the_time_of_an_operation_in_flight_before_it_is_killed(default_docs: Docs) -> None:
    """A stopping agent finishes (or rolls back) the capture or restore it is running; a SIGKILL before
    that could leave the source's CUDA state locked. So its grace period outlasts CRIU's own timeout."""
    from podsnap.engine import CriuOptions

    ds = find(default_docs, "DaemonSet", "podsnap-agent")
    grace = ds["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= CriuOptions().timeout_s + 60, f"agent grace {grace} s < CRIU timeout {CriuOptions().timeout_s} s"


def test_only_the_agent_mounts_the_artifact_claim(matrix: dict[str, Docs]) -> None:
    for name, docs in matrix.items():
        for doc in docs:
            if doc["kind"] not in ("Deployment", "DaemonSet"):
                continue
            claims = [v for v in doc["spec"]["template"]["spec"].get("volumes", []) if "persistentVolumeClaim" in v]
            if doc["kind"] == "DaemonSet":
                assert len(claims) == 1, name
            else:
                assert not claims, f"{name}: {doc['metadata']['name']} mounts the artifact claim"


def test_env_names_passed_to_the_components_are_contract_names(matrix: dict[str, Docs]) -> None:
    known = {v for k, v in vars(contract).items() if k.startswith("ENV_") and isinstance(v, str)}
    for name, docs in matrix.items():
        for doc in docs:
            if doc["kind"] in ("Deployment", "DaemonSet"):
                for c in doc["spec"]["template"]["spec"]["containers"]:
                    extra = {"PODSNAP_POLL_INTERVAL"} if name == "overrides" else set()
                    assert set(env_of(c)) - known - extra == set(), f"{name}: {c['name']} env not in contract.py"


def test_cri_o_scenario_sets_runtime_class_and_kubelet_dir(matrix: dict[str, Docs]) -> None:
    spec = find(matrix["cri-o"], "DaemonSet", "podsnap-agent")["spec"]["template"]["spec"]
    assert spec["runtimeClassName"] == "nvidia"
    paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert paths["seccomp-dir"] == "/var/data/kubelet/seccomp"


def test_deprecated_runtime_values_are_accepted_ignored_and_warned_about(helm: str) -> None:
    """Releases that set runtime.* still upgrade (--reuse-values feeds them back); the values change nothing."""
    import yaml

    def workloads(*args: str) -> list[Any]:
        out = run([helm, "template", "podsnap", str(CHART), "-n", NAMESPACE, *args]).stdout
        return [d for d in yaml.safe_load_all(out) if d and d["kind"] in ("Deployment", "DaemonSet")]

    base = workloads()
    assert workloads("--set", "runtime.type=cri-o", "--set", "runtime.rootDir=/var/lib/containers/storage") == base
    notes = run(
        [helm, "install", "podsnap", str(CHART), "--dry-run=client", "-n", NAMESPACE, "--set", "runtime.type=cri-o"]
    ).stdout.split("NOTES:", 1)[1]
    assert "runtime.* is ignored" in notes


#: clone flags that make namespaces (CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET):
#: the runtime default lets clone through only without them
CLONE_NAMESPACE_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
#: what a Python/CUDA worker calls all the time (threads, memory, I/O, its event loop, the driver's ioctls)
WORKER_SYSCALLS = {
    "read",
    "write",
    "openat",
    "mmap",
    "munmap",
    "mprotect",
    "madvise",
    "futex",
    "epoll_pwait",
    "epoll_ctl",
    "ioctl",
    "execve",
    "rt_sigaction",
    "exit_group",
    "sched_yield",
    "getrandom",
    "set_robust_list",
    "rseq",
    "prctl",
    "socketpair",
    "sendmsg",
    "recvmsg",
    "eventfd2",
    "pipe2",
}
#: what the runtime default keeps from a container without CAP_SYS_ADMIN and friends: namespaces, mounts,
#: keys, BPF, modules, reboot, clock, ptrace-of-others helpers...
ESCAPE_SYSCALLS = {
    "unshare",
    "setns",
    "mount",
    "umount2",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsmount",
    "fsconfig",
    "pivot_root",
    "chroot",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "reboot",
    "swapon",
    "acct",
    "settimeofday",
    "clock_settime",
    "open_by_handle_at",
    "kcmp",
    "pidfd_getfd",
    "lookup_dcookie",
    "quotactl",
    "iopl",
    "ioperm",
    "syslog",
    "vhangup",
    "uselib",
    "mbind",
    "set_mempolicy",
    "fanotify_init",
    "nfsservctl",
}
IO_URING = {"io_uring_setup", "io_uring_enter", "io_uring_register"}


def test_seccomp_profile_is_the_runtime_default_allowlist_without_io_uring(default_docs: Docs) -> None:
    """Any pod may name a Localhost profile and Pod Security "restricted" accepts it: podsnap's must be as
    strict as RuntimeDefault (docs/security.md), and block io_uring, which CRIU cannot dump."""
    profile = json.loads(find(default_docs, "ConfigMap", "podsnap-seccomp")["data"]["profile.json"])
    # OCI LinuxSeccomp keys only: containerd reads a Localhost profile as that struct and drops what it does
    # not know (Docker's archMap, includes/excludes), which would silently change the filter
    assert set(profile) == {"defaultAction", "defaultErrnoRet", "architectures", "syscalls"}
    assert all(set(rule) <= {"names", "action", "errnoRet", "args"} for rule in profile["syscalls"])
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO" and profile["defaultErrnoRet"] == 1
    assert {"SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64"} <= set(profile["architectures"])
    rules = profile["syscalls"]
    allowed = {n for r in rules if r["action"] == "SCMP_ACT_ALLOW" and not r.get("args") for n in r["names"]}
    conditional = {n for r in rules if r["action"] == "SCMP_ACT_ALLOW" and r.get("args") for n in r["names"]}
    assert allowed >= WORKER_SYSCALLS
    assert not (ESCAPE_SYSCALLS | IO_URING) & (allowed | conditional)
    assert conditional == {"clone", "socket", "personality"}
    [clone] = [r for r in rules if r["names"] == ["clone"]]
    [flags] = clone["args"]
    assert flags["index"] == 0 and flags["op"] == "SCMP_CMP_MASKED_EQ" and flags.get("valueTwo", 0) == 0
    assert flags["value"] & CLONE_NAMESPACE_FLAGS == CLONE_NAMESPACE_FLAGS, "clone may not make a namespace"
    # ENOSYS, not EPERM: glibc then creates threads with clone, and io_uring users fall back to plain I/O
    errno = {n: r["errnoRet"] for r in rules if r["action"] == "SCMP_ACT_ERRNO" for n in r["names"]}
    assert errno == {"clone3": 38, **dict.fromkeys(IO_URING, 38)}


def test_seccomp_profile_is_installed_by_the_agent_also_over_the_old_permissive_name(
    default_docs: Docs, matrix: dict[str, Docs]
) -> None:
    cm = find(default_docs, "ConfigMap", "podsnap-seccomp")
    ds = find(default_docs, "DaemonSet", "podsnap-agent")
    init = container(ds, "install-seccomp-profile")
    installed = install_profile(init, cm["data"]["profile.json"])
    # earlier charts shipped an allow-all profile under the old name, which any pod may still name
    assert set(installed) == {"podsnap/capture-v2.json", "podsnap/block-io-uring.json"}
    assert set(installed.values()) == {cm["data"]["profile.json"]}
    operator = container(find(default_docs, "Deployment", "podsnap-operator"), "operator")
    assert env_of(operator)[contract.ENV_SECCOMP_PROFILE] == "podsnap/capture-v2.json"
    # the init container runs only when an agent pod starts: a changed profile must roll the agents
    digest = ds["spec"]["template"]["metadata"]["annotations"]["podsnap.io/seccomp-profile-sha256"]
    assert digest == hashlib.sha256(cm["data"]["profile.json"].encode()).hexdigest()
    minimal = find(matrix["minimal"], "DaemonSet", "podsnap-agent")
    assert "initContainers" not in minimal["spec"]["template"]["spec"]
    minimal_op = container(find(matrix["minimal"], "Deployment", "podsnap-operator"), "operator")
    assert env_of(minimal_op)[contract.ENV_SECCOMP_PROFILE] == ""


def install_profile(init: Doc, profile: str) -> dict[str, str]:
    """Runs the init container's script against a scratch kubelet dir: {name below seccomp/: contents}."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "src").mkdir()
        (root / "src" / "profile.json").write_text(profile)
        script = init["command"][-1].replace("/host/kubelet/seccomp", str(root / "seccomp"))
        script = script.replace("/etc/podsnap/seccomp", str(root / "src"))
        subprocess.run(["/bin/sh", "-c", script], check=True, capture_output=True)
        seccomp = root / "seccomp"
        return {str(p.relative_to(seccomp)): p.read_text() for p in seccomp.rglob("*") if p.is_file()}


def test_pvc_is_kept_and_sized(default_docs: Docs, matrix: dict[str, Docs]) -> None:
    pvc = find(default_docs, "PersistentVolumeClaim", "podsnap-artifacts")
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["spec"]["resources"]["requests"]["storage"] == "100Gi"
    assert "storageClassName" not in pvc["spec"]
    custom = find(matrix["overrides"], "PersistentVolumeClaim", "gpu-checkpoints")
    assert (
        custom["spec"]["storageClassName"] == "efs-sc" and custom["spec"]["resources"]["requests"]["storage"] == "1Ti"
    )
    ds = find(matrix["existing-claim"], "DaemonSet", "podsnap-agent")
    claims = [
        v["persistentVolumeClaim"]["claimName"]
        for v in ds["spec"]["template"]["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    ]
    assert claims == ["podsnap-shared-artifacts"]


def test_agent_update_strategy_refuses_a_surge(helm: str) -> None:
    """Two agents on one node at once: the new one's startup recovery would act on a capture the old one is
    still dumping. A surge fails naming the key and the way out; no surge (0, 0%, unset) renders."""
    surges = ["1", "25%", "1%"]
    messages = parallel(
        lambda v: render_error(helm, "--set-string" if v.endswith("%") else "--set", f"{KEY_SURGE}={v}"), surges
    )
    for value, message in zip(surges, messages, strict=True):
        assert KEY_SURGE in message and "must be 0" in message, f"maxSurge={value}:\n{message}"
        assert "agent.updateStrategy.rollingUpdate.maxUnavailable" in message, message
    for args in (
        [],
        ["--set", f"{KEY_SURGE}=0"],
        ["--set-string", f"{KEY_SURGE}=0%"],
        # OnDelete has no rollingUpdate: the chart drops it, surge and all
        ["--set", "agent.updateStrategy.type=OnDelete", "--set", f"{KEY_SURGE}=1"],
    ):
        strategy = find(render(helm, *args), "DaemonSet", "podsnap-agent")["spec"]["updateStrategy"]
        assert strategy.get("rollingUpdate", {}).get("maxSurge", 0) in (0, "0%"), (args, strategy)


KEY_SURGE = "agent.updateStrategy.rollingUpdate.maxSurge"


def test_storage_class_dash_means_no_class(helm_template: Any) -> None:
    pvc = find(helm_template("--set", "storage.pvc.storageClass=-"), "PersistentVolumeClaim")
    assert pvc["spec"]["storageClassName"] == ""


def rules(doc: Doc) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in doc["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def test_rbac_is_split_by_component_with_least_privilege(default_docs: Docs, matrix: dict[str, Docs]) -> None:
    op = rules(find(default_docs, "ClusterRole", "podsnap-operator"))
    agent = rules(find(default_docs, "ClusterRole", "podsnap-agent"))
    for plural in (p for p, *_ in contract.CRDS.values()):
        expected = {"get", "list", "watch", "patch"}
        if plural != contract.PLURAL_SNAPSHOT_POLICIES:  # policies are the user's: never created or deleted
            expected |= {"create", "delete"}
        assert op[("podsnap.io", plural)] == expected
        assert {"patch", "update"} <= op[("podsnap.io", f"{plural}/status")]
        assert op[("podsnap.io", f"{plural}/finalizers")] == {"update"}
    assert op[("batch", "jobs")] == {"get", "list", "create", "delete"}
    # delete: when a WaitForCheckpoint hold ends, the pods the webhook held are deleted (DESIGN, failure semantics)
    # watch and pods/status: pods the webhook could not place (placement) get their Restored condition
    assert op[("", "pods")] == {"get", "list", "watch", "delete"} and op[("", "pods/status")] == {"patch"}
    assert op[("apps", "deployments")] == {"get", "list", "watch", "patch"}
    assert op[("", "events")] == {"create", "patch"}
    assert ("", "secrets") not in op and ("", "secrets") not in agent
    hook_rule = next(
        r
        for r in find(default_docs, "ClusterRole", "podsnap-operator")["rules"]
        if "mutatingwebhookconfigurations" in r["resources"]
    )
    assert hook_rule["resourceNames"] == ["podsnap-webhook"] and set(hook_rule["verbs"]) == {"get", "patch"}
    assert agent[("podsnap.io", "podsnapshotcontents")] == {"get", "list", "watch", "patch"}
    assert {"patch"} <= agent[("podsnap.io", "podsnapshotcontents/status")]
    assert agent[("podsnap.io", "podsnapshots")] == {"get"}
    assert agent[("", "pods")] == {"get", "list", "watch", "patch"} and agent[("", "pods/status")] == {"patch"}
    # placement: the labels of its own Node (the webhook refuses any other Node, any other change); the
    # operator removes those of a Node whose agent is gone (operator/stale_placement.py)
    assert agent[("", "nodes")] == {"patch"} and ("", "nodes/status") not in agent
    assert op[("", "nodes")] == {"get", "list", "watch", "patch"} and ("", "nodes/status") not in op
    off = rules(find(matrix["minimal"], "ClusterRole", "podsnap-operator"))
    assert off[("", "nodes")] == {"get", "list", "watch"}, "no placement (no webhook): no Node patch"
    # in its own namespace, one ConfigMap: since when each node has had no Ready agent (operator/agent_absence.py)
    role = find(default_docs, "Role", "podsnap-operator")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [ABSENCE_CONFIGMAP],
            "verbs": ["get", "update"],
        },
    ]
    binding = find(default_docs, "RoleBinding", "podsnap-operator")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "podsnap-operator"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "podsnap-operator", "namespace": NAMESPACE}]
    for verbs in list(op.values()) + list(agent.values()):
        assert "*" not in verbs and "escalate" not in verbs and "bind" not in verbs
    for name, sa in (("podsnap-operator", "podsnap-operator"), ("podsnap-agent", "podsnap-agent")):
        binding = find(default_docs, "ClusterRoleBinding", name)
        assert binding["roleRef"]["name"] == name
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}]


def test_namespace_users_get_podsnap_objects_through_the_aggregated_roles(
    default_docs: Docs, matrix: dict[str, Docs]
) -> None:
    aggregate = "rbac.authorization.k8s.io/aggregate-to-"
    namespaced = {p for kind, (p, *_) in contract.CRDS.items() if kind != contract.KIND_POD_SNAPSHOT_CONTENT}
    assert len(namespaced) == 3
    view = find(default_docs, "ClusterRole", "podsnap-view")
    edit = find(default_docs, "ClusterRole", "podsnap-edit")

    def aggregated_into(role: Doc) -> set[str]:
        return {
            k.removeprefix(aggregate) for k, v in labels_of(role).items() if k.startswith(aggregate) and v == "true"
        }

    # view's rules reach edit and admin too; edit's reach admin
    assert aggregated_into(view) == {"view", "edit", "admin"}
    assert aggregated_into(edit) == {"edit", "admin"}
    assert rules(view) == {("podsnap.io", p): {"get", "list", "watch"} for p in namespaced}
    writes = {"create", "update", "patch", "delete", "deletecollection"}
    # no status (the operator's and the agents' to write), no cluster-scoped contents
    assert rules(edit) == {("podsnap.io", p): writes for p in namespaced}
    roles = [d["metadata"]["name"] for d in matrix["minimal"] if d["kind"] == "ClusterRole"]
    assert sorted(roles) == ["podsnap-agent", "podsnap-operator"]


def test_webhook_ignores_failures_and_skips_own_namespace(default_docs: Docs, matrix: dict[str, Docs]) -> None:
    mwc = find(default_docs, "MutatingWebhookConfiguration", "podsnap-webhook")
    (hook,) = mwc["webhooks"]
    assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "None"
    assert 1 <= hook["timeoutSeconds"] <= 30
    assert hook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    assert hook["clientConfig"]["service"] == {
        "name": "podsnap-webhook",
        "namespace": NAMESPACE,
        "path": "/mutate-pods",
        "port": 443,
    }
    exprs = {e["key"]: e for e in hook["namespaceSelector"]["matchExpressions"]}
    assert exprs["kubernetes.io/metadata.name"]["operator"] == "NotIn"
    assert NAMESPACE in exprs["kubernetes.io/metadata.name"]["values"]
    assert exprs[contract.LABEL_WEBHOOK] == {
        "key": contract.LABEL_WEBHOOK,
        "operator": "NotIn",
        "values": [contract.LABEL_WEBHOOK_DISABLED_VALUE],
    }
    svc = find(default_docs, "Service", "podsnap-webhook")
    assert svc["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": "webhook", "protocol": "TCP"}]
    assert svc["spec"]["selector"]["app.kubernetes.io/component"] == "operator"
    over = find(matrix["overrides"], "MutatingWebhookConfiguration")["webhooks"][0]
    assert (
        over["timeoutSeconds"] == 10
        and over["objectSelector"]["matchExpressions"][0]["key"] == "podsnap.io/snapshot-policy"
    )


def test_self_signed_webhook_tls_is_consistent(default_docs: Docs) -> None:
    import base64

    from cryptography import x509

    secret = find(default_docs, "Secret", "podsnap-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"
    ca_pem = base64.b64decode(secret["data"]["ca.crt"])
    ca_bundle = find(default_docs, "MutatingWebhookConfiguration")["webhooks"][0]["clientConfig"]["caBundle"]
    assert base64.b64decode(ca_bundle) == ca_pem
    ca = x509.load_pem_x509_certificate(ca_pem)
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    assert cert.issuer == ca.subject
    cert.verify_directly_issued_by(ca)  # raises when the CA did not sign it
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert f"podsnap-webhook.{NAMESPACE}.svc" in names


def test_cert_manager_scenarios(matrix: dict[str, Docs]) -> None:
    cm = matrix["cert-manager"]
    cert = find(cm, "Certificate", "podsnap-webhook")
    assert cert["spec"]["secretName"] == "podsnap-webhook-tls"
    assert cert["spec"]["issuerRef"] == {"kind": "ClusterIssuer", "name": "internal-ca", "group": "cert-manager.io"}
    assert f"podsnap-webhook.{NAMESPACE}.svc" in cert["spec"]["dnsNames"]
    mwc = find(cm, "MutatingWebhookConfiguration")
    assert mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/podsnap-webhook"
    assert "caBundle" not in mwc["webhooks"][0]["clientConfig"]
    own = matrix["cert-manager-selfsigned"]
    assert find(own, "Issuer")["spec"] == {"selfSigned": {}}
    assert find(own, "Certificate")["spec"]["issuerRef"]["name"] == find(own, "Issuer")["metadata"]["name"]


def test_service_monitor_scrapes_operator_and_agents(matrix: dict[str, Docs]) -> None:
    docs = matrix["service-monitor"]
    sm = find(docs, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["interval"] == "15s"
    selected = [
        d for d in docs
        if d["kind"] == "Service"
        and sm["spec"]["selector"]["matchLabels"].items() <= labels_of(d).items()
        and labels_of(d)["app.kubernetes.io/component"] in sm["spec"]["selector"]["matchExpressions"][0]["values"]
    ]  # fmt: skip
    assert sorted(d["metadata"]["name"] for d in selected) == ["podsnap-agent-metrics", "podsnap-operator-metrics"]
    assert all(any(p["name"] == "metrics" for p in d["spec"]["ports"]) for d in selected)
    assert find(docs, "Service", "podsnap-agent-metrics")["spec"]["clusterIP"] == "None"


def test_overrides_scenario_applies_images_ports_and_scheduling(matrix: dict[str, Docs]) -> None:
    docs = matrix["overrides"]
    op = container(find(docs, "Deployment", "snap-operator"), "operator")
    assert op["image"] == "registry.example.com:5000/ml/podsnap-operator@sha256:" + "0123456789abcdef" * 4
    assert env_of(op)[contract.ENV_LOG_LEVEL] == "debug" and env_of(op)[contract.ENV_METRICS_PORT] == "9400"
    assert {p["name"]: p["containerPort"] for p in op["ports"]} == {"health": 9090, "metrics": 9400, "webhook": 10443}
    ds = find(docs, "DaemonSet", "snap-agent")
    agent = container(ds, "agent")
    assert (
        agent["image"] == "registry.example.com:5000/ml/podsnap-agent:0.1.0-rc1"
        and agent["imagePullPolicy"] == "Always"
    )
    assert agent["resources"]["limits"]["memory"] == "64Gi" and agent["args"] == ["--verbose"]
    assert ds["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert ds["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert find(docs, "Service", "snap-webhook")["spec"]["selector"]["app.kubernetes.io/component"] == "operator"


def test_local_cluster_scenario(matrix: dict[str, Docs]) -> None:
    docs = matrix["local-cluster"]
    ds = find(docs, "DaemonSet", "podsnap-agent")
    spec = ds["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"podsnap.io/local-cluster": "true"}
    # pulled from the local cluster's registry, where `make cluster-up` pushed them with `make images-push`
    assert container(ds, "agent")["image"] == "localhost:5000/podsnap/podsnap-agent:dev"
    seccomp = {v["name"]: v for v in spec["volumes"]}["seccomp-dir"]
    assert seccomp["hostPath"]["path"] == "/var/lib/podsnap-cluster/kubelet/seccomp"
    assert container(ds, "agent")["imagePullPolicy"] == "IfNotPresent"
    pvc = find(docs, "PersistentVolumeClaim")
    assert pvc["spec"]["storageClassName"] == "podsnap-local" and pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    # the chart's scenario and the e2e suite's values file are one file
    assert (CHART / "ci" / "local-cluster-values.yaml").read_text() == (
        REPO / "overlays" / "local-cluster" / "values.yaml"
    ).read_text()


def test_notes_warn_first_then_say_what_to_check(helm: str) -> None:
    proc = run(
        [
            helm,
            "install",
            "podsnap",
            str(CHART),
            "--dry-run=client",
            "-n",
            NAMESPACE,
            "--set",
            "crds.keep=false",
            "--set",
            "agent.nodeSelector=null",
        ]
    )
    notes = proc.stdout.split("NOTES:", 1)[1]
    assert notes.lstrip().startswith("WARNINGS")
    assert notes.index("crds.keep=false") < notes.index("rollout status")
    assert "agent.nodeSelector is empty" in notes
    for line in (
        "kubectl -n podsnap-system rollout status deployment/podsnap-operator",
        "kubectl -n podsnap-system rollout status daemonset/podsnap-agent",
        "kubectl get crd snapshotjobs.podsnap.io podsnapshots.podsnap.io",
    ):
        assert line in notes
    registry = ["--set", "image.registry=registry.example.com/podsnap"]
    quiet = run([helm, "install", "podsnap", str(CHART), "--dry-run=client", "-n", NAMESPACE, *registry]).stdout
    quiet_notes = quiet.split("NOTES:", 1)[1]
    assert "WARNINGS" not in quiet_notes
    # where the images come from: the user's registry, since podsnap publishes none
    assert "podsnap publishes none" in quiet_notes and "make images-push" in quiet_notes
    assert "registry.example.com/podsnap/podsnap-agent:0.1.0" in quiet_notes


#: chart-testing's configuration flags (ct lint/install --help, v3.x)
CT_KEYS = {
    "remote", "target-branch", "since", "build-id", "lint-conf", "chart-yaml-schema", "validate-maintainers",
    "validate-chart-schema", "validate-yaml", "check-version-increment", "process-all-charts", "charts",
    "chart-repos", "chart-dirs", "excluded-charts", "helm-extra-args", "helm-lint-extra-args", "helm-repo-extra-args",
    "helm-dependency-extra-args", "debug", "upgrade", "skip-missing-values", "namespace", "release-label",
    "exclude-deprecated", "kubectl-timeout", "print-logs", "skip-clean-up", "use-helmignore", "additional-commands",
}  # fmt: skip


def test_ct_yaml_is_a_valid_chart_testing_config() -> None:
    import yaml

    config = yaml.safe_load((REPO / "ct.yaml").read_text())
    assert set(config) <= CT_KEYS, set(config) - CT_KEYS
    assert config["target-branch"] == "main" and config["validate-maintainers"] is False
    assert "--timeout" in config["helm-extra-args"]
    charts = [d / "podsnap" for d in (REPO / p for p in config["chart-dirs"])]
    assert [c for c in charts if (c / "Chart.yaml").exists()] == [CHART]
    # ct's Chart.yaml schema wants named maintainers; it installs once per ci/*-values.yaml
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert all(m.get("name") for m in meta["maintainers"]) and meta["apiVersion"] == "v2"
    assert all(p.name.endswith("-values.yaml") for p in (CHART / "ci").iterdir())


def test_names_fit_63_characters_for_a_long_release_name(helm: str) -> None:
    import yaml

    release = ("gpu-inference-" * 4)[:53].rstrip("-")  # Helm's longest release name is 53
    proc = run([helm, "template", release, str(CHART), "--namespace", NAMESPACE])
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d and d["kind"] != "CustomResourceDefinition"]
    names = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert all(len(n) <= 63 for _, n in names), sorted(names, key=lambda kn: len(kn[1]))[-3:]
    assert len(set(names)) == len(names)
    assert find(docs, "Deployment")["metadata"]["name"].endswith("-operator")
