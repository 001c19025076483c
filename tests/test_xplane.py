"""The XPlane reader against the five real JAX profiles of ../shared/realtraces/xplane (AMD
MI300X/MI355X, JAX 0.8 and older): kernel counts and per-name GPU time, API calls and copies equal
a reading of the raw protobuf written here on its own (a few lines of wire-format decoding, not
the product's), and damaged files are refused in one line with the store unchanged."""

from __future__ import annotations

import struct
from collections import Counter
from pathlib import Path

import pytest
from conftest import shared_files

from traceq import TraceFormatError

FILES = shared_files("realtraces/xplane", "*.xplane.pb")


def _varint(b: bytes, i: int) -> tuple[int, int]:
    shift = out = 0
    while True:
        c = b[i]
        i += 1
        out |= (c & 127) << shift
        shift += 7
        if c < 128:
            return out, i


def _msg(b: bytes, start: int, end: int):
    i = start
    while i < end:
        key, i = _varint(b, i)
        wire = key & 7
        if wire == 0:
            v, i = _varint(b, i)
        elif wire == 2:
            n, i = _varint(b, i)
            v = (i, i + n)
            i += n
        elif wire == 1:
            v = struct.unpack("<q", b[i:i + 8])[0]
            i += 8
        else:
            v = b[i:i + 4]
            i += 4
        yield key >> 3, v


def raw_reading(path: Path) -> dict[str, Counter]:
    """Per GPU-stream event name: count and total ps (kernels and copies apart), and the host
    events that carry a correlation id, read straight from the XSpace."""
    b = path.read_bytes()
    kernels, kernel_ps, copies, calls = Counter(), Counter(), Counter(), Counter()
    for field, plane in _msg(b, 0, len(b)):
        if field != 1:
            continue
        name, lines, event_names, stat_names = "", [], {}, {}
        for f, v in _msg(b, *plane):
            if f == 2:
                name = b[v[0]:v[1]].decode()
            elif f == 3:
                lines.append(v)
            elif f in (4, 5):
                entry = dict(_msg(b, *v))
                meta = dict(_msg(b, *entry[2]))
                (event_names if f == 4 else stat_names)[entry.get(1, 0)] = b[meta[2][0]:meta[2][1]].decode() \
                    if 2 in meta else ""
        for line in lines:
            fields = list(_msg(b, *line))
            line_name = next((b[v[0]:v[1]].decode() for f, v in fields if f == 2), "")
            for f, ev in fields:
                if f != 4:
                    continue
                e = list(_msg(b, *ev))
                ev_name = event_names.get(next((v for k, v in e if k == 1), 0), "")
                duration = next((v for k, v in e if k == 3), 0)
                stat_keys = {stat_names.get(dict(_msg(b, *v)).get(1, 0)) for k, v in e if k == 4}
                if name.startswith("/device:GPU:") and line_name.startswith("Stream #") and duration:
                    if "memcpy_details" in stat_keys or ev_name.lower().startswith(("memcpy", "memset")):
                        copies[ev_name] += 1
                    else:
                        kernels[ev_name] += 1
                        kernel_ps[ev_name] += duration
                elif name.startswith("/host:") and "correlation_id" in stat_keys and duration:
                    calls[ev_name] += 1
    return {"kernels": kernels, "kernel_ps": kernel_ps, "copies": copies, "calls": calls}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name.split("__")[-2])
def test_xplane_loads_as_the_raw_file_says(path: Path, tmp_path: Path) -> None:
    import traceq

    truth = raw_reading(path)
    assert sum(truth["kernels"].values()) > 0
    t = traceq.load(path, tmp_path / "s.duckdb")
    con = t.con
    got = dict(con.execute("SELECT name, count(*) FROM kernels WHERE trace_id = ? GROUP BY 1", [t.id]).fetchall())
    assert got == dict(truth["kernels"])
    # whole ns per event (the file has ps): each event may lose under 1 ns
    got_ns = dict(con.execute("SELECT name, sum(dur_ns) FROM kernels WHERE trace_id = ? GROUP BY 1", [t.id]).fetchall())
    for name, ps in truth["kernel_ps"].items():
        assert abs(got_ns[name] * 1000 - ps) <= 1000 * truth["kernels"][name] + 1000, name
    copies = con.execute("SELECT count(*) FROM memops WHERE trace_id = ?", [t.id]).fetchone()[0]
    assert copies == sum(truth["copies"].values())
    calls = dict(con.execute("SELECT name, count(*) FROM api_calls WHERE trace_id = ? GROUP BY 1", [t.id]).fetchall())
    assert calls == dict(truth["calls"])
    # every kernel with a correlation id finds its launching call
    unlinked = con.execute("""SELECT count(*) FROM kernels k WHERE trace_id = ? AND correlation_id IS NOT NULL
                              AND NOT EXISTS (SELECT 1 FROM api_calls a WHERE a.trace_id = k.trace_id
                                              AND a.correlation_id = k.correlation_id)""", [t.id]).fetchone()[0]
    assert unlinked == 0
    gpu = con.execute("SELECT vendor, sm_count, clock_hz FROM gpus WHERE trace_id = ? AND device_id = 0",
                      [t.id]).fetchone()
    assert gpu[0] == "AMD" and gpu[1] in (256, 304) and gpu[2] in (2_100_000_000, 2_400_000_000)


def test_xla_op_and_module_ranges_follow_the_kernels(tmp_path: Path) -> None:
    """Each kernel with an HLO op lies in an op range around the host call that launched it (the
    call's correlation id is the kernel's, in the raw protobuf's reading: `raw_reading`'s calls
    are those events), and the module ranges name the programs."""
    import traceq

    path = next(p for p in FILES if "jax08_gemm" in p.name)
    t = traceq.load(path, tmp_path / "s.duckdb")
    ops = t.con.execute("SELECT count(*) FROM nvtx WHERE trace_id = ? AND domain = 'XLA Ops'", [t.id]).fetchone()[0]
    around_call = t.con.execute("""SELECT count(*) FROM kernel_launches k JOIN nvtx n ON n.trace_id = k.trace_id
        AND n.domain = 'XLA Ops' AND n.tid = k.launch_tid AND n.start_ns = k.launch_start_ns
        AND n.end_ns = k.launch_end_ns WHERE k.trace_id = ?""", [t.id]).fetchone()[0]
    assert ops > 0 and around_call >= ops
    modules = [r[0] for r in t.con.execute(
        "SELECT name FROM nvtx WHERE trace_id = ? AND domain = 'XLA Modules' ORDER BY start_ns", [t.id]).fetchall()]
    assert modules and all(m.startswith("XlaModule:#hlo_module=jit_") and m.endswith("#") for m in modules)
    assert any("jit_dot" in m for m in modules)


def test_xplane_read_with_its_pages_released_behind_the_walk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader drops the mapped pages behind its walk (`MappedFile.release`); released before
    every event, the profile reads as the raw file says (the pages come back from the file)."""
    import traceq
    from traceq.ingest import protobuf, xplane

    released: list[tuple[int, int]] = []
    release = protobuf.MappedFile.release
    monkeypatch.setattr(xplane, "_RELEASE_BYTES", 1)
    monkeypatch.setattr(protobuf.MappedFile, "release",
                        lambda self, start, end: (released.append((start, end)), release(self, start, end))[1])
    path = next(p for p in FILES if "jax08_attention" in p.name)
    truth = raw_reading(path)
    t = traceq.load(path, tmp_path / "s.duckdb")
    assert len(released) > sum(truth["kernels"].values())  # every line's events, each plane
    got = dict(t.con.execute("SELECT name, count(*) FROM kernels WHERE trace_id = ? GROUP BY 1", [t.id]).fetchall())
    assert got == dict(truth["kernels"])
    calls = dict(t.con.execute("SELECT name, count(*) FROM api_calls WHERE trace_id = ? GROUP BY 1",
                               [t.id]).fetchall())
    assert calls == dict(truth["calls"])


@pytest.mark.parametrize("cut", [7, 1000, 50_000])
def test_damaged_xplane_is_one_line_and_the_store_unchanged(cut: int, tmp_path: Path) -> None:
    import traceq

    store = tmp_path / "s.duckdb"
    traceq.load(FILES[0], store)
    before = store.read_bytes()
    broken = tmp_path / "cut.xplane.pb"
    broken.write_bytes(FILES[2].read_bytes()[:cut])
    with pytest.raises(TraceFormatError) as e:
        traceq.load(broken, store)
    assert "\n" not in str(e.value) and "cut.xplane.pb" in str(e.value)
    assert store.read_bytes() == before


def _raw_op_passes(path: Path) -> dict[tuple[str, str], str]:
    """(module, HLO op) -> the pass JAX's name stack gives it ('backward' under transpose(...),
    'forward' under jvp(...)), for the ops whose stack says, from the HloProtos the XSpace's
    metadata plane embeds (XEventMetadata stats named 'Hlo Proto'; HloModuleProto name 1,
    computations 3, instructions 2, instruction name 1, metadata 7, op_name 2)."""
    b = path.read_bytes()
    text = lambda v: b[v[0]:v[1]].decode("utf-8", "replace")  # noqa: E731
    passes = {}
    for field, plane in _msg(b, 0, len(b)):
        if field != 1:
            continue
        fields = list(_msg(b, *plane))
        if next((text(v) for f, v in fields if f == 2), "") != "/host:metadata":
            continue
        stat_names = {}
        for f, v in fields:
            if f == 5:
                entry = dict(_msg(b, *v))
                stat_names[entry.get(1, 0)] = text(dict(_msg(b, *entry[2])).get(2, (0, 0)))
        for f, v in fields:
            if f != 4:
                continue
            meta = dict(_msg(b, *v))[2]
            for k, stat in _msg(b, *meta):
                s = dict(_msg(b, *stat)) if k == 5 else {}
                if stat_names.get(s.get(1), "").lower().replace(" ", "_") != "hlo_proto" or 6 not in s:
                    continue
                for k1, module in _msg(b, *s[6]):
                    if k1 != 1:
                        continue
                    parts = list(_msg(b, *module))
                    name = next((text(x) for n, x in parts if n == 1), "")
                    for n, computation in parts:
                        for n2, ins in (_msg(b, *computation) if n == 3 else ()):
                            if n2 != 2:
                                continue
                            i = dict(_msg(b, *ins))
                            stack = text(dict(_msg(b, *i[7])).get(2, (0, 0))) if 7 in i else ""
                            if "transpose(" in stack or "jvp(" in stack:
                                passes[(name, text(i[1]))] = "backward" if "transpose(" in stack else "forward"
    return passes


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name.split("__")[-2])
def test_xplane_structure_from_xla(path: Path, tmp_path: Path) -> None:
    """JAX's structure in a `jax.profiler` trace (docs/structure.md): its kernels get their HLO op
    as layer where one launching call ran one op, and the pass the op's name stack in the
    embedded HLO gives (checked against the raw protobuf, above); the main program's
    executions are iterations."""
    import polars as pl

    import traceq
    from traceq.analysis.structure.attribution import kernel_attribution

    passes = _raw_op_passes(path)
    t = traceq.load(path, tmp_path / "s.duckdb")
    frame = kernel_attribution(t.con, t.id)
    ops = frame.filter(pl.col("attribution") == "XLA op")
    assert ops.height > 0 and frame["iteration"].drop_nulls().n_unique() >= 2
    ops_with_stack = {op for _, op in passes}
    checked = ops.filter(pl.col("layer").is_in(list(ops_with_stack)))
    wrong = [(op, p) for op, p in checked.select("layer", "pass").iter_rows()
             if p not in {v for (m, o), v in passes.items() if o == op}]
    assert wrong == []
    if passes:  # a differentiated program (te_fused_attn: forward and backward attention)
        assert checked.height > 0 and set(checked["pass"]) == set(passes.values())
