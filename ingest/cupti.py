"""Enumeration values of Nsight Systems exports (its ENUM_* tables, which some exports lack).

The memcpy kinds are CUPTI's numbering too; nsys renumbers memory kinds and launch types, so
nvprof's own CUPTI maps live in ingest/nvprof.py. The labels are the words `nsys stats` prints.
"""

MEMCPY_KIND = {
    0: "Unknown",
    1: "Host-to-Device",
    2: "Device-to-Host",
    3: "Host-to-Array",
    4: "Array-to-Host",
    5: "Array-to-Array",
    6: "Array-to-Device",
    7: "Device-to-Array",
    8: "Device-to-Device",
    9: "Host-to-Host",
    10: "Peer-to-Peer",
    11: "Unified Host-to-Device",
    12: "Unified Device-to-Host",
    13: "Unified Device-to-Device",
}

MEMORY_KIND = {
    0: "Pageable",
    1: "Pinned",
    2: "Device",
    3: "Array",
    4: "Managed",
    5: "Device Static",
    6: "Managed Static",
    7: "Unknown",
}

LAUNCH_TYPE = {1: "regular", 2: "cooperative", 3: "cooperative_multi_device"}

SHMEM_LIMIT_OPTIN = 1
"""sharedMemoryLimitConfig of a function that opted in to more than 48 KiB of shared memory per
block (CUPTI_FUNC_SHMEM_LIMIT_OPTIN; 0 is the default limit)."""

MEMORY_OPERATION = {0: "alloc", 1: "free"}
