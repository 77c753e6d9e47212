"""CRIU config lines, binary lookup and log tails (no CRIU run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from podsnap.engine import CriuError, CriuOptions, find_binary
from podsnap.engine.criu import log_tail
from podsnap.engine.cuda import NoCuda, uuid_bytes


def test_container_defaults_on_the_host() -> None:
    assert CriuOptions().dump_lines(False) == [
        "shell-job",
        "tcp-established",
        "file-locks",
        "ext-unix-sk",
        "manage-cgroups=soft",
        "link-remap",
    ]


def test_namespace_mode_ignores_cgroups_and_tcp_close_is_honoured() -> None:
    lines = CriuOptions(tcp="close", extra=("ghost-limit 64M",)).restore_lines(True)
    assert "manage-cgroups=ignore" in lines and "tcp-close" in lines and lines[-1] == "ghost-limit 64M"
    assert "link-remap" not in lines


def test_external_net_ns_is_declared_at_dump_and_inherited_at_restore() -> None:
    opts = CriuOptions(external_net_ns=True)
    assert "external net[4026531840]:podsnap-netns" in opts.dump_lines(False, net_ns_inode=4026531840)
    assert "inherit-fd fd[7]:podsnap-netns" in opts.restore_lines(False, net_ns_fd=7)


def test_missing_criu_says_run_make_setup(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PODSNAP_CRIU", str(tmp_path / "nope"))
    with pytest.raises(CriuError, match="PODSNAP_CRIU"):
        find_binary()
    monkeypatch.delenv("PODSNAP_CRIU")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("podsnap.engine.criu.REPO_ROOT", tmp_path)
    with pytest.raises(CriuError, match="make setup"):
        find_binary()


def test_a_bundle_wrapper_is_unwrapped_to_its_elf(tmp_path: Path) -> None:
    bundle = tmp_path / "criu-4.2.1"
    (bundle / "lib").mkdir(parents=True)
    (bundle / "criu").write_bytes(b"\x7fELF" + b"\0" * 60)
    (bundle / "criu.sh").write_text("#!/bin/sh\nexec true\n")
    for f in ("criu", "criu.sh"):
        (bundle / f).chmod(0o755)
    link = tmp_path / "bin-criu"
    link.symlink_to(bundle / "criu.sh")
    binary = find_binary(link)
    assert binary.exe == bundle / "criu" and binary.lib_dir == bundle / "lib"


def test_log_tail_puts_errors_first(tmp_path: Path) -> None:
    log = tmp_path / "dump.log"
    log.write_text(
        "\n".join([f"line {i}" for i in range(100)] + ["Error (x.c:1): boom"] + [f"after {i}" for i in range(40)])
    )
    tail = log_tail(log)
    assert tail.splitlines()[0] == "Error (x.c:1): boom"
    assert tail.splitlines()[-1] == "after 39"
    assert "no CRIU log" in log_tail(tmp_path / "missing.log")


def test_no_cuda_raises_naming_the_call() -> None:
    with pytest.raises(Exception, match="cuCheckpointProcessLock for pid 5 failed with CUDA_UNAVAILABLE"):
        NoCuda().lock(5)
    assert NoCuda().cuda_pids([1, 2]) == {}


def test_gpu_uuid_to_bytes() -> None:
    assert uuid_bytes("GPU-8c1e2a3b-0000-1111-2222-333344445555") == bytes.fromhex("8c1e2a3b000011112222333344445555")
    with pytest.raises(ValueError, match="16 bytes"):
        uuid_bytes("GPU-1234")
