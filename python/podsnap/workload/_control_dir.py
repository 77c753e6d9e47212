"""The SDK's view of the control directory (the protocol itself lives in `podsnap.controldir`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from podsnap import controldir
from podsnap.workload._errors import ControlDirError


def control_dir_from_env(environ: Mapping[str, str] | None = None) -> Path | None:
    """The control dir the environment names (podsnap's variable first, then Dynamo's), or None.

    None means "no snapshot machinery here": the worker simply cold-starts and serves.
    """
    try:
        return controldir.control_dir_from_env(environ)
    except controldir.ControlDirError as e:
        raise ControlDirError(str(e)) from e
