"""The config file the engine writes means to CRIU what the engine meant (real CRIU, `criu check`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from podsnap.engine import Criu, CriuOptions


def criu_check(criu: Criu, lines: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    conf = tmp_path / "check.conf"
    conf.write_text("".join(f"{line}\n" for line in lines))
    return subprocess.run(
        [str(criu.binary.exe), "check", "--no-default-config", "--config", str(conf)],
        capture_output=True,
        text=True,
        check=False,
        env=criu.binary.env(),
        timeout=60,
    )


@pytest.mark.parametrize("namespaced", [False, True])
def test_every_line_the_engine_writes_is_accepted_by_criu(criu: Criu, tmp_path: Path, namespaced: bool) -> None:
    for lines in (CriuOptions().dump_lines(namespaced), CriuOptions().restore_lines(namespaced)):
        got = criu_check(criu, lines, tmp_path)
        assert got.returncode == 0, f"{lines}: {got.stdout}{got.stderr}"


def test_the_cgroup_mode_reaches_criu(criu: Criu, tmp_path: Path) -> None:
    # a mode CRIU does not know must be refused: proof the value is parsed, not dropped. (Written as
    # "manage-cgroups ignore", CRIU silently used its default mode and restores into pods failed.)
    lines = [line for line in CriuOptions().restore_lines(True) if not line.startswith("manage-cgroups")]
    assert criu_check(criu, [*lines, "manage-cgroups=ignore"], tmp_path).returncode == 0
    assert criu_check(criu, [*lines, "manage-cgroups=bogus"], tmp_path).returncode != 0
    assert "manage-cgroups=ignore" in CriuOptions().restore_lines(True)
