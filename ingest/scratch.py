"""Scratch folders of loads in the temporary folder, marked with their process: a killed load's
staging (tens of MB) is removed by the next load, which sees its process gone."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

SCRATCH_PREFIX = "traceq-kineto-"
OWNER_FILE = "owner.pid"


def new_scratch(prefix: str | None = None) -> Path:
    """A new scratch folder in the temporary folder, marked with this process's id; first, the
    folders of loads whose process is gone (killed: no `close` ran) are removed, so a killed
    load's staging (tens of MB) lasts only until the next load."""
    sweep_stale_scratch()
    folder = Path(tempfile.mkdtemp(prefix=prefix or SCRATCH_PREFIX))
    (folder / OWNER_FILE).write_text(f"{os.getpid()}\n", encoding="ascii")
    return folder


def sweep_stale_scratch(root: Path | None = None) -> list[Path]:
    """Remove the scratch folders under `root` (the temporary folder) whose owning process no
    longer runs (or, unmarked, that are over a day old); the folders removed."""
    import time

    root = Path(root or tempfile.gettempdir())
    removed = []
    for folder in root.glob(SCRATCH_PREFIX + "*"):
        try:
            owner = (folder / OWNER_FILE).read_text(encoding="ascii").strip()
            stale = not _running(int(owner))
        except (OSError, ValueError):
            try:
                stale = time.time() - folder.stat().st_mtime > 86_400
            except OSError:
                continue
        if stale and folder.is_dir():
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: running
        return True
    return True
