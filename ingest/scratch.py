"""Scratch folders of loads in the temporary folder, marked with their process: a killed load's
staging (tens of MB) is removed by the next load, which sees its process gone. And a thread's
in-memory scratch database, kept from one load to the next."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from pathlib import Path

import duckdb

from traceq.store import connect

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


_thread = threading.local()


def memory_scratch(settings: dict[str, str]) -> duckdb.DuckDBPyConnection:
    """This thread's in-memory scratch database (DuckDB `settings`, spilling to a scratch folder
    of its own), made at its first call and kept: a reader takes a cursor of it (whose
    temporary tables go when it closes) and drops the tables it made, so a process that loads
    many small files opens one database, not one per file (12 ms each, 3 % of a 250-kernel
    Kineto rank's load)."""
    con = getattr(_thread, "scratch", None)
    if con is None:
        spill = new_scratch()
        atexit.register(shutil.rmtree, spill, ignore_errors=True)
        con = _thread.scratch = connect(":memory:", **settings, temp_directory=str(spill / "spill"))
    return con


def forget_memory_scratch() -> None:
    """The next `memory_scratch` makes a new database (a reader could not drop its tables)."""
    _thread.scratch = None
