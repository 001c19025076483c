"""Commands over a run of several ranks: comm, overlap, ranks."""

from __future__ import annotations

from typing import Annotated

import typer

from traceq.analysis.choices import CommBy, RanksBy
from traceq.api import Run
from traceq.cli.base import DatasetOpt, DbOpt, FormatOpt, IterOpt, OutOpt, RunArg, _show_run_table, app, example


def _ranks_said(r: Run) -> str:
    return (f"{r.world_size} rank{'s' if r.world_size != 1 else ''}"
            + (", clocks aligned on collective ends" if r.clock != "one trace" else ""))


@app.command(epilog=example('traceq comm ddp_resnet18_2gpu'))
def comm(
    run: RunArg = None,
    by: Annotated[CommBy, typer.Option(help="One row per collective, iteration and rank, or per collective "
                                            "across ranks")] = CommBy.rank,
    db: DbOpt = None,
    dataset: DatasetOpt = None,
    iteration_regex: IterOpt = None,
    fmt: FormatOpt = None,
    out: OutOpt = None,
) -> None:
    """Collective communication (NCCL, RCCL) per collective, iteration and rank: time, bytes, algorithm and bus bandwidth, start and end skew."""
    def build(r: Run, progress):
        frame = r.comm(by, iteration_regex=iteration_regex, progress=progress)
        what = ("per collective, iteration and rank" if by is CommBy.rank
                else "per collective across ranks (time, bandwidth: on the last rank to start)")
        return frame, (f"{r.name}: collective communication {what} ({_ranks_said(r)}; "
                       "bus bandwidth = bytes / time x nccl-tests' factor)")

    _show_run_table(run, db, dataset, fmt, out, build)


@app.command(epilog=example('traceq overlap ddp_resnet18_2gpu'))
def overlap(
    run: RunArg = None,
    db: DbOpt = None,
    dataset: DatasetOpt = None,
    iteration_regex: IterOpt = None,
    fmt: FormatOpt = None,
    out: OutOpt = None,
) -> None:
    """Per rank and iteration: computation, communication, the share of communication hidden under computation, exposed communication, idle time."""
    def build(r: Run, progress):
        frame = r.overlap(iteration_regex=iteration_regex, progress=progress)
        return frame, (f"{r.name}: communication against computation per rank and iteration "
                       f"({_ranks_said(r)}; hidden = communication while computation ran)")

    _show_run_table(run, db, dataset, fmt, out, build)


@app.command(epilog=example('traceq ranks ddp_resnet18_2gpu --by collective'))
def ranks(
    run: RunArg = None,
    by: Annotated[RanksBy, typer.Option(help="One row per iteration and rank, or per late collective with "
                                             "what delayed it")] = RanksBy.iteration,
    k: Annotated[int, typer.Option("--k", "-k", min=1, help="With --by collective: how many collectives, "
                                                           "latest start first")] = 10,
    db: DbOpt = None,
    dataset: DatasetOpt = None,
    iteration_regex: IterOpt = None,
    fmt: FormatOpt = None,
    out: OutOpt = None,
) -> None:
    """Ranks side by side: iteration time, time waiting for other ranks, the slowest rank, and what delayed late collectives."""
    def build(r: Run, progress):
        frame = r.ranks(by, k=k, iteration_regex=iteration_regex, progress=progress)
        if by is RanksBy.collective:
            return frame, (f"{r.name}: the {k} collectives that started latest on their last rank, and the layer or "
                           f"kernel that ran longer there than on the others before it ({_ranks_said(r)})")
        return frame, (
            f"{r.name}: iteration time per rank ({_ranks_said(r)}; wait: in collectives for later "
            "ranks; slowest: the one the others waited for longest; shift: added to the rank's clock)")

    # per late collective, what delayed it is the answer: a narrow table keeps it before the times;
    # per iteration and rank, its time (span), wait and the slowest before the communication time
    _show_run_table(run, db, dataset, fmt, out, build,
                    priorities={"delayed_by": 1, "delayed_ns": 2, "start_skew_ns": 2, "last_rank": 3}
                    if by is RanksBy.collective else {"span_ns": 2, "comm_ns": 3})
