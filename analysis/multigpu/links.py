"""The peak bandwidth of a GPU's links to its peers, the roof of `traceq comm`'s bus bandwidth.

nccl-tests' bus bandwidth is what one GPU's links carry in one direction, so the peak it is held
against is the GPU's one-direction bandwidth to the other GPUs: NVLink's where the product has
it (its total over links and both directions, as datasheets give it, halved), else its PCIe
slot's. Which link a run's NCCL used is not in the traces; this table gives the faster one the
product has, so a PCIe-only server of an NVLink product reads against a roof it cannot reach.

Sources, marked on each row:
  V  NVIDIA Tesla V100 datasheet (2020): SXM2 "NVLink 300 GB/s", PCIe "32 GB/s".
  A  NVIDIA A100 datasheet (2021): SXM4 "NVLink 600 GB/s", PCIe "64 GB/s" (Gen4).
  H  NVIDIA H100 datasheet (2023): SXM5 "NVLink 900 GB/s", PCIe "PCIe Gen5 128 GB/s".
  H2 NVIDIA H200 product brief (2024): SXM and NVL "NVLink 900 GB/s".
  B  NVIDIA DGX B200 datasheet (2024): "1.8 TB/s" NVLink per GPU.
  P  NVIDIA Tesla P100 datasheet (2016): SXM2 "NVLink 160 GB/s", PCIe "32 GB/s" (Gen3).
  M  AMD Instinct MI300X data sheet (2023): "896 GB/s" peak aggregate bidirectional Infinity Fabric.
PCIe x16 per direction: 15.75 GB/s (Gen3), 31.5 (Gen4), 63 (Gen5) after encoding; the
datasheets round these to 16/32/64 each way, which is what is used here (their totals halved).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import duckdb


@dataclass(frozen=True)
class Link:
    """A GPU's fastest link to its peers: name and one-direction peak in GB/s (1e9 bytes/s)."""

    link: str
    gbps: float
    source: str


_LINKS: tuple[tuple[str, Link], ...] = (  # first match wins: the specific names before the general
    (r"V100.*(SXM2|DGXS)", Link("NVLink 2", 150.0, "V")),
    (r"V100.*PCIE", Link("PCIe Gen3 x16", 16.0, "V")),
    (r"A100.*(SXM4|PG509)", Link("NVLink 3", 300.0, "A")),
    (r"A100.*PCIE", Link("PCIe Gen4 x16", 32.0, "A")),
    (r"H100.*PCIe", Link("PCIe Gen5 x16", 64.0, "H")),
    (r"H100", Link("NVLink 4", 450.0, "H")),
    (r"H200", Link("NVLink 4", 450.0, "H2")),
    (r"B200", Link("NVLink 5", 900.0, "B")),
    (r"P100.*SXM2", Link("NVLink 1", 80.0, "P")),
    (r"P100.*PCIE", Link("PCIe Gen3 x16", 16.0, "P")),
    (r"MI300X", Link("Infinity Fabric", 448.0, "M")),
)


def link_for(gpu_name: str | None) -> Link | None:
    """The link peak of a GPU by its name ('NVIDIA H200', 'Tesla V100-SXM2-32GB'), or None."""
    if not gpu_name:
        return None
    return next((link for pattern, link in _LINKS if re.search(pattern, gpu_name, re.IGNORECASE)), None)


def run_link(con: duckdb.DuckDBPyConnection, run_id: int) -> tuple[str | None, Link | None]:
    """(GPU name, its link) of a run: the GPU its rank 0 ran on."""
    row = con.execute("""
        SELECT g.name FROM ranks k JOIN gpus g ON g.trace_id = k.trace_id
        WHERE k.run_id = ? AND (k.device_id IS NULL OR g.device_id = k.device_id)
          AND g.device_id IN (SELECT device_id FROM kernel_queues q WHERE q.trace_id = k.trace_id)
        ORDER BY k.rank, g.device_id LIMIT 1""", [run_id]).fetchall()
    name = row[0][0] if row else None
    return name, link_for(name)
