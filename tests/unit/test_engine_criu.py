"""CRIU config lines, binary lookup and log tails (no CRIU run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from podsnap.engine import CriuError, CriuOptions, find_binary
from podsnap.engine._criu_config import config_text, inherit_line
from podsnap.engine._criu_runner import log_tail
from podsnap.engine._cuda import NoCuda, uuid_bytes


def test_container_defaults_on_the_host() -> None:
    assert CriuOptions().dump_lines(False) == [
        "shell-job",
        "tcp-established",
        "file-locks",
        "ext-unix-sk",
        "manage-cgroups=soft",
        "network-lock=skip",
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
    monkeypatch.setattr("podsnap.engine._criu_binary.REPO_ROOT", tmp_path)
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


@pytest.mark.parametrize("bad", ["ghost-limit 64M\naction-script /tmp/evil", "ghost-limit\x0064M", "x\ry", "\x7f"])
def test_a_control_character_in_an_extra_line_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match=r"extra\[0\].*control character"):
        CriuOptions(extra=(bad,))


def test_every_config_line_is_checked_where_the_file_is_written() -> None:
    assert config_text(["shell-job", "tcp-close"]) == "shell-job\ntcp-close\n"
    with pytest.raises(ValueError, match="control character"):
        config_text(["shell-job\naction-script /tmp/evil"])


def test_inherit_keys_are_pipe_ids_only() -> None:
    assert inherit_line(7, "pipe:[123]") == "inherit-fd fd[7]:pipe:[123]"
    for bad in ("pipe:[1]\naction-script /tmp/evil", "file:[1]", "pipe:[x]", "pipe:[1] extra"):
        with pytest.raises(ValueError, match="inherit-fd key"):
            inherit_line(7, bad)


@pytest.mark.parametrize(
    ("field", "value"),
    [("tcp", "open"), ("manage_cgroups", "bogus"), ("log_level", 9), ("timeout_s", 0), ("extra", "one string")],
)
def test_options_outside_their_range_are_refused_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        CriuOptions(**{field: value})  # type: ignore[arg-type]


def test_criu_error_message_is_short_and_keeps_the_log_apart(tmp_path: Path) -> None:
    from podsnap.engine._criu_runner import failure

    log = tmp_path / "restore.log"
    log.write_text("\n".join([f"(00.0{i}) noise {i}" for i in range(50)] + ["Error (cr-restore.c:1): boom"]))
    err = failure("restore", 1, "some output\n", log, None)
    assert str(err) == f"criu restore exited with 1: Error (cr-restore.c:1): boom (full log: {log})"
    assert err.log_path == log and "noise 49" in err.log_tail
    no_log = failure("dump", 1, "Error (config.c:1): bad option\n", tmp_path / "none.log", 42)
    assert (
        str(no_log)
        == "criu dump exited with 1 (namespaces of pid 42): Error (config.c:1): bad option (it wrote no log)"
    )
    assert no_log.log_path is None
