"""CUPTI enumeration values shared by nsys exports and nvprof databases.

The numbers are CUPTI's (cupti_activity.h); nsys copies them into its ENUM_* tables, which
some exports lack, so traceq ships them. The labels are the words `nsys stats` prints.
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

MEMORY_OPERATION = {0: "alloc", 1: "free"}
