"""The AMD row readers read a batch of rows at a time (ingest/columns.py): rows that span several
batches load as a reading of the whole file says (csv.DictReader and sqlite3 here, not the
product's code): kernel counts and times per device, devices numbered in the order they first
come, the dispatches without a name or times skipped, blank lines, short and long rows read as
DictReader reads them; the text-to-integer conversion equals int(text, 0) on odd texts."""

from __future__ import annotations

import csv
import sqlite3
from collections import Counter
from pathlib import Path

import pytest

from traceq.ingest.columns import BATCH_ROWS

HEADER = ["Index", "KernelName", "gpu-id", "queue-id", "grd", "wgr", "lds", "scr", "arch_vgpr", "BeginNs", "EndNs"]


def _rows(n: int) -> list[list[object]]:
    """n dispatches on gpu-ids 9, 4 and 7 (first seen in that order, 4 only past the first
    batch), every 1000th without a name, every 777th without an end."""
    rows = []
    for i in range(n):
        gpu = 9 if i < BATCH_ROWS + 5 or i % 3 == 0 else (4 if i % 3 == 1 else 7)
        name = "" if i % 1000 == 999 else f"kernel_{i % 5}<float>.kd"
        end = "" if i % 777 == 776 else 1_000_000 + 10 * i + 3 + i % 4
        rows.append([i, name, gpu, i % 2, 4096 * (1 + i % 3), 256, 0, 0, 32, 1_000_000 + 10 * i, end])
    return rows


def _expected(rows: list[dict[str, str]]) -> tuple[Counter, Counter, list[str]]:
    """Per (device, name): kernels and total time, as a whole reading sees the rows."""
    devices: dict[str, int] = {}
    count, time = Counter(), Counter()
    for r in rows:
        if not r["KernelName"] or not r["BeginNs"] or not r["EndNs"]:
            continue
        device = devices.setdefault(r["gpu-id"], len(devices))
        name = r["KernelName"].removesuffix(".kd")
        count[device, name] += 1
        time[device, name] += int(r["EndNs"]) - int(r["BeginNs"])
    return count, time, list(devices)


def _loaded(path: Path, tmp_path: Path) -> tuple[Counter, Counter]:
    import traceq

    t = traceq.load(path, tmp_path / "s.duckdb")
    count, time = Counter(), Counter()
    for device, name, n, ns in t.con.execute(
            "SELECT device_id, name, count(*), sum(dur_ns) FROM kernels WHERE trace_id = ? GROUP BY ALL", [t.id]).fetchall():
        count[device, name], time[device, name] = n, int(ns)
    return count, time


def test_a_csv_of_several_batches_loads_as_a_whole_reading_says(tmp_path: Path) -> None:
    path = tmp_path / "results.csv"
    rows = _rows(2 * BATCH_ROWS + 123)
    with path.open("w", newline="") as f:
        writer = csv.writer(f, quoting=csv.QUOTE_NONNUMERIC)
        writer.writerow(HEADER)
        for i, row in enumerate(rows):
            writer.writerow(row[:6] if i == 5 else row + ["extra"] if i == 6 else row)  # a short row, a long one
            if i == 10:
                f.write("\n")  # a blank line
    count, time, gpus = _expected(list(csv.DictReader(path.open(newline=""))))
    assert gpus == ["9", "4", "7"] and sum(count.values()) > 2 * BATCH_ROWS
    assert _loaded(path, tmp_path) == (count, time)


def test_a_results_db_of_several_batches_loads_as_a_whole_reading_says(tmp_path: Path) -> None:
    path = tmp_path / "results.db"
    con = sqlite3.connect(path)
    con.execute(f"CREATE TABLE KERN ({', '.join(f'{chr(34)}{c}{chr(34)}' for c in HEADER)})")
    rows = [[f'"{r[1]}"' if r[1] else None, *r[2:]] for r in _rows(BATCH_ROWS + 500)]
    con.executemany(f"INSERT INTO KERN VALUES (NULL, {', '.join('?' * (len(HEADER) - 1))})",
                    [[v if v != "" else None for v in r] for r in rows])
    con.commit()
    raw = [dict(zip(HEADER, ["" if v is None else str(v).strip('"') for v in r]))
           for r in con.execute("SELECT * FROM KERN")]
    con.close()
    count, time, _ = _expected(raw)
    assert _loaded(path, tmp_path) == (count, time)


@pytest.mark.parametrize("texts", [["12", "-3", "0", "", None, "007", "0x1f", " 42 ", "1_000", "+5", "4.0", "x"],
                                   ["9223372036854775807", "9223372036854775808", "-9223372036854775808"],
                                   ["1", "2", "3"]])
def test_texts_become_integers_as_int_of_the_text_reads_them(texts: list[str | None]) -> None:
    from traceq.ingest.columns import ints

    def reference(value: str | None) -> int | None:
        try:
            number = int(value.strip(), 0) if value not in (None, "") else None
        except ValueError:
            return None
        return number if number is not None and -(1 << 63) <= number < (1 << 63) else None

    assert ints(texts, len(texts)).to_pylist() == [reference(t) for t in texts]
