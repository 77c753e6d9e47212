"""The `podsnap` command's parsing and its refusals (no CRIU run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from podsnap.cli import build_parser, main
from podsnap.cli.doctor import (
    all_checks,
    check_first_write,
    check_io_uring,
    check_openat2,
    check_thp,
    write_fresh_memory,
)


def test_commands_parse() -> None:
    p = build_parser()
    a = p.parse_args(["capture", "--pid", "5", "--out", "/x", "--namespace-pid", "9", "--tcp", "close"])
    assert (a.pid, a.out, a.namespace_pid, a.tcp) == (5, "/x", 9, "close")
    r = p.parse_args(["restore", "/x", "--skip-compat-check"])
    assert r.skip_compat_check and r.artifact == "/x"
    d = p.parse_args(["demo", "--device", "cuda", "--weights-gib", "8"])
    assert (d.device, d.weights_gib, d.json, d.cooperative) == ("cuda", 8.0, "out/demo.json", False)
    assert p.parse_args(["demo", "--cooperative"]).cooperative
    c = p.parse_args(["capture", "--pid", "5", "--out", "/x", "--control-dir", "/c", "--ready-timeout", "3"])
    assert (c.control_dir, c.ready_timeout) == ("/c", 3.0)
    r = p.parse_args(["restore", "/x", "--control-dir", "/c", "--context", "A=1", "--context", "B=x=y"])
    assert (r.control_dir, r.context) == ("/c", ["A=1", "B=x=y"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--context", "A=1"], "--context needs --control-dir"),
        (["--control-dir", "/c", "--context", "NOEQUALS"], "--context 'NOEQUALS': expected KEY=VALUE"),
        (["--control-dir", "/c", "--context", "=1"], "--context '=1': expected KEY=VALUE"),
        (["--control-dir", "/c", "--context", "1A=1"], "--context '1A=1'"),
        (["--control-dir", "/c", "--context", "A-B=1"], "--context 'A-B=1'"),
    ],
)
def test_restore_refuses_a_bad_context_before_restoring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    # the artifact does not exist: a refusal of the context must come first, with exit status 2
    assert main(["restore", str(tmp_path / "nope"), *argv]) == 2
    assert message in capsys.readouterr().err


def test_capture_refuses_a_control_dir_that_does_not_exist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import os

    rc = main(
        ["capture", "--pid", str(os.getpid()), "--out", str(tmp_path / "a"), "--control-dir", str(tmp_path / "c")]
    )
    assert rc == 1
    assert "not a directory; pass the worker's SNAPSHOT_CONTROL_DIR" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize(
    ("content", "status"),
    [("[always] madvise never", "OK"), ("always [madvise] never", "WARN"), ("always madvise [never]", "WARN")],
)
def test_doctor_advises_transparent_huge_pages_with_the_measured_gains(
    tmp_path: Path, content: str, status: str
) -> None:
    setting = tmp_path / "enabled"
    setting.write_text(content + "\n")
    check = check_thp(setting)
    assert check.status == status
    if status == "WARN":
        assert f"echo always > {setting}" in check.fix
        assert "CUDA checkpoint -34%" in check.fix and "CRIU restore -41%" in check.fix
    assert check_thp(tmp_path / "missing").status == "WARN"


@pytest.mark.parametrize(
    ("rates", "status"),
    [
        ((10.3, 31.4), "WARN"),  # the H200 VM right after it started (bench/h200/h200-2026-12-02-first-touch.json)
        ((1.3, 6.9), "WARN"),  # the 2-core test VM
        ((20.0, 23.0), "OK"),  # a node whose RAM is backed up front: both writes fault and zero pages alike
        ((30.0, 12.0), "OK"),
    ],
)
def test_doctor_warns_when_memory_written_first_is_much_slower(rates: tuple[float, float], status: str) -> None:
    measured = iter(rates)
    check = check_first_write(lambda: next(measured))
    assert check.status == status, check
    assert f"{rates[0]:.1f} GiB/s" in check.detail and f"{rates[1]:.1f} GiB/s the second time" in check.detail
    if status == "WARN":
        assert "first restores will be slower" in check.detail
        assert "preallocate" in check.fix and "docs/troubleshooting.md" in check.fix


def test_doctor_measures_a_real_write_of_fresh_memory() -> None:
    rate = write_fresh_memory(mib=64)
    assert 0.01 < rate < 1000, rate  # GiB/s: a real memset of 64 MiB, neither instant nor stuck


def test_doctor_checks_openat2(monkeypatch: pytest.MonkeyPatch) -> None:
    from podsnap import controldir

    assert check_openat2().status == ("OK" if controldir.openat2_available() else "FAIL")
    monkeypatch.setattr(controldir, "openat2_available", lambda: False)  # stand-in for a kernel before 5.6
    check = check_openat2()
    assert check.status == "FAIL" and "5.6" in check.fix


def test_restore_of_a_missing_artifact_fails_clearly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["restore", str(tmp_path / "nope")]) == 1
    assert "no such artifact directory" in capsys.readouterr().err


def test_capture_of_a_missing_pid_fails_clearly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capture", "--pid", "999999999", "--out", str(tmp_path / "a")]) == 1
    err = capsys.readouterr().err
    assert "999999999" in err
    assert not (tmp_path / "a").exists()


def test_doctor_lines_have_a_status_and_a_fix_when_not_ok(tmp_path: Path) -> None:
    checks = all_checks()
    names = {c.name for c in checks}
    assert {"kernel", "criu", "CAP_SYS_ADMIN", "transparent hugepages", "first write of memory", "io_uring"} <= names
    for c in checks:
        assert c.status in ("OK", "WARN", "FAIL")
        if c.status == "FAIL":
            assert c.fix, c
    assert check_thp().status in ("OK", "WARN") and check_io_uring().status in ("OK", "WARN")
    rc = main(["doctor", "--json", str(tmp_path / "d.json")])
    data = json.loads((tmp_path / "d.json").read_text())
    assert rc == (1 if any(c["status"] == "FAIL" for c in data) else 0)


def test_run_delegates_to_podsnap_run() -> None:
    # podsnap-run with no command is a usage error: the delegation passes its exit status through
    assert main(["run"]) != 0


def test_inspect_shows_the_source_and_verifies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from podsnap.engine import Manifest, ProcInfo
    from podsnap.engine import _artifact as art
    from podsnap.engine._host import host_facts

    staging = art.Staging(tmp_path / "a")
    (staging.criu_dir / "pages-1.img").write_bytes(b"p" * 10)
    files = art.describe_files(staging.path)
    staging.write_manifest(
        Manifest(host_facts(with_gpus=False), (ProcInfo(5, 5, 1, "w", ()),), (), (), files, extra={"demo": {}})
    )
    staging.publish()
    assert main(["inspect", str(tmp_path / "a"), "--verify"]) == 0
    out = capsys.readouterr().out
    assert "5/5 w" in out and "OK   digests" in out and "restorable on this host" in out and "extra      demo" in out
    (tmp_path / "a" / "criu" / "pages-1.img").write_bytes(b"q" * 10)
    assert main(["inspect", str(tmp_path / "a"), "--verify"]) == 1
    assert "FAIL digests" in capsys.readouterr().out


def test_capture_refuses_extra_that_is_not_json_before_touching_anything(tmp_path: Path) -> None:
    import os

    from podsnap.engine import CaptureError, CaptureOptions, capture

    with pytest.raises(CaptureError, match="JSON-serializable"):
        capture(os.getpid(), tmp_path / "a", CaptureOptions(extra={"x": object()}))
    assert not (tmp_path / "a").exists()
