"""Processes whose wall clock is shifted by libfaketime (Debian package ``faketime``)."""

from __future__ import annotations

import glob
import os
from pathlib import Path

LIBRARY = next(iter(sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))), "")
SITE = Path(__file__).parent / "shifted_clock"
ROOT = Path(__file__).resolve().parents[2]


def require() -> None:
    """Skip the calling test module without libfaketime; under CI its absence is an error."""
    import pytest

    if LIBRARY:
        return
    if os.environ.get("CI") == "true":
        raise RuntimeError("libfaketime is missing: `make setup` installs it (Debian package faketime)")
    pytest.skip("libfaketime (Debian package faketime) is not installed", allow_module_level=True)


def shifted(seconds: float) -> dict[str, str]:
    """The environment of a process whose wall clock runs ``seconds`` off (its monotonic clock is true)."""
    path = os.pathsep.join(filter(None, [str(SITE), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return {
        "LD_PRELOAD": LIBRARY,
        "FAKETIME": f"{seconds:+g}",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_DONT_RESET": "1",
        "PYTHONPATH": path,
    }
