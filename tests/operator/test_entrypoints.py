"""The console scripts the images run (`podsnap-operator`, `podsnap-agent`), as processes against the API
server with the ServiceAccount kubeconfigs: they start, answer /healthz and serve /metrics."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from podsnap import contract as c
from tests.support.controlplane import free_port
from tests.support.operator_env import Env
from tests.support.waiting import wait_for

BIN = Path(sys.executable).parent


def http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=2) as resp:
        return str(resp.read().decode())


@pytest.mark.parametrize("component", ["operator", "agent"])
def test_console_script_serves_health_and_metrics(env: Env, component: str, tmp_path: Path) -> None:
    health, metrics = free_port(), free_port()
    kubeconfig = env.operator_kubeconfig if component == "operator" else env.agent_kubeconfig
    environ = {
        **os.environ,
        c.ENV_HEALTH_PORT: str(health),
        c.ENV_METRICS_PORT: str(metrics),
        c.ENV_WEBHOOK_PORT: "0",
        c.ENV_ARTIFACT_ROOT: str(tmp_path / "artifacts"),
        c.ENV_STATE_DIR: str(tmp_path / "state"),  # a directory of this test, not the default on this host
        c.ENV_TOKEN_KEY_DIR: str(env.operator_ctx.config.token_key_dir),
        # a node with no work, so this second agent never competes with the suite's own
        c.ENV_NODE_NAME: "node-entrypoint-test",
    }
    proc = subprocess.Popen(
        [str(BIN / f"podsnap-{component}"), "--kubeconfig", str(kubeconfig)],
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(
            lambda: proc.poll() is None and http_get(f"http://127.0.0.1:{health}/healthz"),
            timeout=30,
            what=f"{component} /healthz (exit code {proc.poll()})",
        )
        text = http_get(f"http://127.0.0.1:{metrics}/metrics")
        assert f"podsnap_{component}_" in text
    except AssertionError:
        proc.terminate()
        raise AssertionError(proc.communicate(timeout=20)[0].decode(errors="replace")[-3000:]) from None
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
    assert b"Traceback" not in out, out.decode(errors="replace")[-3000:]
