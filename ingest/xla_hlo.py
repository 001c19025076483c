"""The source names of XLA's ops, from the HLO modules an XPlane embeds.

`jax.profiler` writes each compiled program's HLO (an `HloProto`) into the XSpace's
`/host:metadata` plane, as the `Hlo Proto` (`hlo_proto`) stat of an event metadata entry. Every HLO
instruction carries `OpMetadata.op_name`, JAX's *name stack* for the source op
(`jit(train_step)/transpose(jvp())/dot_general`): the same text XLA writes into its nsys thunk
ranges (`Thunk:#name=...,hlo_op=...#`), from which `analysis.structure.xla` reads the pass.

Field numbers (xla/xla_data.proto, xla/service/hlo.proto, tsl/profiler/protobuf/xplane.proto):
XPlane.event_metadata 4, stat_metadata 5 (map entries: key 1, value 2); XEventMetadata.stats 5;
XStatMetadata.name 2; XStat.metadata_id 1, bytes_value 6; HloProto.hlo_module 1;
HloModuleProto.name 1, computations 3; HloComputationProto.instructions 2;
HloInstructionProto.name 1, metadata 7; OpMetadata.op_name 2. Fields of other numbers and wire
types are skipped, so a newer writer's additions do no harm.
"""

from __future__ import annotations

from typing import Any

from traceq.ingest import protobuf as pb

HLO_STAT = "hlo_proto"
"""The stat that holds a program's HloProto, as its metadata names it ('Hlo Proto' in JAX 0.11)."""


def op_names(buf: Any, plane: pb.Span) -> dict[tuple[str, str], str]:
    """(module name, instruction name) -> op_name, for every instruction with one, from the
    metadata plane spanning `plane` in `buf`."""
    stat_names: dict[int, str] = {}
    metadata: list[pb.Span] = []
    for number, wire, value in pb.fields(buf, *plane):  # type: ignore[misc]
        if wire != 2 or number not in (4, 5):
            continue
        key, entry = _map_entry(buf, value)
        if entry is None:
            continue
        if number == 5:
            stat_names[key] = _field_text(buf, entry, 2)
        else:
            metadata.append(entry)
    names: dict[tuple[str, str], str] = {}
    for entry in metadata:
        for number, wire, stat in pb.fields(buf, *entry):  # type: ignore[misc]
            if number == 5 and wire == 2:
                proto = _hlo_bytes(buf, stat, stat_names)
                if proto is not None:
                    _module(buf, proto, names)
    return names


def _map_entry(buf: Any, span: object) -> tuple[int, pb.Span | None]:
    key, value = 0, None
    for number, wire, field in pb.fields(buf, *span):  # type: ignore[misc]
        if number == 1 and wire == 0:
            key = pb.signed(field)  # type: ignore[arg-type]
        elif number == 2 and wire == 2:
            value = field
    return key, value  # type: ignore[return-value]


def _field_text(buf: Any, span: object, wanted: int) -> str:
    for number, wire, value in pb.fields(buf, *span):  # type: ignore[misc]
        if number == wanted and wire == 2:
            return pb.text(buf, value)
    return ""


def _hlo_bytes(buf: Any, stat: object, stat_names: dict[int, str]) -> pb.Span | None:
    """The HloProto an XStat holds, if it is the `hlo_proto` stat."""
    kind, data = None, None
    for number, wire, value in pb.fields(buf, *stat):  # type: ignore[misc]
        if number == 1 and wire == 0:
            kind = stat_names.get(value)  # type: ignore[arg-type]
        elif number == 6 and wire == 2:
            data = value
    named = (kind or "").lower().replace(" ", "_") == HLO_STAT
    return data if named else None  # type: ignore[return-value]


def _module(buf: Any, proto: object, names: dict[tuple[str, str], str]) -> None:
    for number, wire, module in pb.fields(buf, *proto):  # type: ignore[misc]
        if number != 1 or wire != 2:
            continue
        name, computations = "", []
        for field, kind, value in pb.fields(buf, *module):  # type: ignore[misc]
            if field == 1 and kind == 2:
                name = pb.text(buf, value)
            elif field == 3 and kind == 2:
                computations.append(value)
        for computation in computations:
            for field, kind, instruction in pb.fields(buf, *computation):  # type: ignore[misc]
                if field == 2 and kind == 2:
                    op, op_name = _instruction(buf, instruction)
                    if op and op_name:
                        names[(name, op)] = op_name


def _instruction(buf: Any, span: object) -> tuple[str, str]:
    name = op_name = ""
    for number, wire, value in pb.fields(buf, *span):  # type: ignore[misc]
        if number == 1 and wire == 2:
            name = pb.text(buf, value)
        elif number == 7 and wire == 2:
            op_name = _field_text(buf, value, 2)
    return name, op_name
