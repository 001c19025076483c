-- rocprofv3's rocpd database, schema version 3: the tables tests/test_rocpd.py fills, restated
-- (names, columns, types and NOT NULL as rocprofiler-sdk declares them) from rocprofiler-sdk's
-- source/share/rocprofiler-sdk-rocpd/rocpd_tables.sql and rocpd_views.sql, commit
-- 19d33bb304b35d94a2a082f6771d918408e0c848 (github.com/ROCm/rocprofiler-sdk, MIT licence,
-- Copyright (c) Advanced Micro Devices, Inc.). Written for traceq's tests, not copied: foreign
-- keys, defaults and CHECKs are left out, and the tables traceq does not read (PMC, samples,
-- arguments, memory allocations) are not here. {{uuid}} is replaced by the run's uuid (with its
-- leading underscore), {{guid}} by its guid.
CREATE TABLE "rocpd_metadata{{uuid}}" (id INTEGER PRIMARY KEY AUTOINCREMENT, tag TEXT NOT NULL, value TEXT NOT NULL);
CREATE TABLE "rocpd_string{{uuid}}" (id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT NOT NULL,
    string TEXT NOT NULL UNIQUE);
CREATE TABLE "rocpd_info_node{{uuid}}" (id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT NOT NULL,
    hash BIGINT NOT NULL UNIQUE, machine_id TEXT NOT NULL UNIQUE, name TEXT, system_name TEXT, hostname TEXT,
    release TEXT, version TEXT, hardware_name TEXT, domain_name TEXT);
CREATE TABLE "rocpd_info_process{{uuid}}" (id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT NOT NULL,
    nid INTEGER NOT NULL, ppid INTEGER, pid INTEGER NOT NULL, name TEXT, init BIGINT, fini BIGINT, start BIGINT,
    "end" BIGINT, command TEXT, environment JSONB NOT NULL, extdata JSONB NOT NULL);
CREATE TABLE "rocpd_info_thread{{uuid}}" (id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT NOT NULL,
    nid INTEGER NOT NULL, ppid INTEGER, pid INTEGER NOT NULL, tid INTEGER NOT NULL, name TEXT, start BIGINT,
    "end" BIGINT, extdata JSONB NOT NULL);
CREATE TABLE "rocpd_info_agent{{uuid}}" (id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT NOT NULL,
    nid INTEGER NOT NULL, pid INTEGER NOT NULL, type TEXT, absolute_index INTEGER, logical_index INTEGER,
    type_index INTEGER, uuid INTEGER, name TEXT, generic_name TEXT, model_name TEXT, vendor_name TEXT,
    product_name TEXT, extdata JSONB NOT NULL);
CREATE TABLE "rocpd_info_queue{{uuid}}" (id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT NOT NULL,
    nid INTEGER NOT NULL, pid INTEGER NOT NULL, name TEXT, extdata JSONB NOT NULL);
CREATE TABLE "rocpd_info_stream{{uuid}}" (id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT NOT NULL,
    nid INTEGER NOT NULL, pid INTEGER NOT NULL, name TEXT, extdata JSONB NOT NULL);
CREATE TABLE "rocpd_info_code_object{{uuid}}" (id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT NOT NULL,
    nid INTEGER NOT NULL, pid INTEGER NOT NULL, agent_id INTEGER, uri TEXT, load_base BIGINT, load_size BIGINT,
    load_delta BIGINT, storage_type TEXT, extdata JSONB NOT NULL);
CREATE TABLE "rocpd_info_kernel_symbol{{uuid}}" (id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT NOT NULL,
    nid INTEGER NOT NULL, pid INTEGER NOT NULL, code_object_id INTEGER NOT NULL, kernel_name TEXT, display_name TEXT,
    kernel_object INTEGER, kernarg_segment_size INTEGER, kernarg_segment_alignment INTEGER,
    group_segment_size INTEGER, private_segment_size INTEGER, sgpr_count INTEGER, arch_vgpr_count INTEGER,
    accum_vgpr_count INTEGER, extdata JSONB NOT NULL);
CREATE TABLE "rocpd_track{{uuid}}" (id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT NOT NULL,
    nid INTEGER NOT NULL, ppid INTEGER, pid INTEGER, tid INTEGER, agent_id INTEGER, queue_id INTEGER,
    stream_id INTEGER, name_id INTEGER, extdata JSONB NOT NULL);
CREATE TABLE "rocpd_timestamp{{uuid}}" (id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT NOT NULL,
    value BIGINT NOT NULL, phase INTEGER, track_id INTEGER);
CREATE TABLE "rocpd_event{{uuid}}" (id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT NOT NULL,
    category_id INTEGER, stack_id INTEGER, parent_stack_id INTEGER, correlation_id INTEGER,
    call_stack JSONB NOT NULL, line_info JSONB NOT NULL, extdata JSONB NOT NULL);
CREATE TABLE "rocpd_region{{uuid}}" (id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT NOT NULL,
    track_id INTEGER NOT NULL, name_id INTEGER NOT NULL, start_id INTEGER NOT NULL, end_id INTEGER NOT NULL,
    event_id INTEGER, extdata JSONB NOT NULL);
CREATE TABLE "rocpd_kernel_dispatch{{uuid}}" (id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT NOT NULL,
    track_id INTEGER NOT NULL, kernel_id INTEGER NOT NULL, dispatch_id INTEGER NOT NULL,
    start_id INTEGER NOT NULL, end_id INTEGER NOT NULL, private_segment_size INTEGER, group_segment_size INTEGER,
    workgroup_size_x INTEGER NOT NULL, workgroup_size_y INTEGER NOT NULL, workgroup_size_z INTEGER NOT NULL,
    grid_size_x INTEGER NOT NULL, grid_size_y INTEGER NOT NULL, grid_size_z INTEGER NOT NULL,
    region_name_id INTEGER, event_id INTEGER, extdata JSONB NOT NULL);
CREATE TABLE "rocpd_memory_copy{{uuid}}" (id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT NOT NULL,
    track_id INTEGER NOT NULL, start_id INTEGER NOT NULL, end_id INTEGER NOT NULL, name_id INTEGER NOT NULL,
    dst_agent_id INTEGER, dst_address INTEGER, src_agent_id INTEGER, src_address INTEGER, size INTEGER NOT NULL,
    region_name_id INTEGER, event_id INTEGER, extdata JSONB NOT NULL);
CREATE VIEW rocpd_metadata AS SELECT * FROM "rocpd_metadata{{uuid}}";
CREATE VIEW rocpd_string AS SELECT * FROM "rocpd_string{{uuid}}";
CREATE VIEW rocpd_info_node AS SELECT * FROM "rocpd_info_node{{uuid}}";
CREATE VIEW rocpd_info_process AS SELECT * FROM "rocpd_info_process{{uuid}}";
CREATE VIEW rocpd_info_thread AS SELECT * FROM "rocpd_info_thread{{uuid}}";
CREATE VIEW rocpd_info_agent AS SELECT * FROM "rocpd_info_agent{{uuid}}";
CREATE VIEW rocpd_info_queue AS SELECT * FROM "rocpd_info_queue{{uuid}}";
CREATE VIEW rocpd_info_stream AS SELECT * FROM "rocpd_info_stream{{uuid}}";
CREATE VIEW rocpd_info_code_object AS SELECT * FROM "rocpd_info_code_object{{uuid}}";
CREATE VIEW rocpd_info_kernel_symbol AS SELECT * FROM "rocpd_info_kernel_symbol{{uuid}}";
CREATE VIEW rocpd_track AS SELECT * FROM "rocpd_track{{uuid}}";
CREATE VIEW rocpd_timestamp AS SELECT * FROM "rocpd_timestamp{{uuid}}";
CREATE VIEW rocpd_event AS SELECT * FROM "rocpd_event{{uuid}}";
CREATE VIEW rocpd_region AS SELECT * FROM "rocpd_region{{uuid}}";
CREATE VIEW rocpd_kernel_dispatch AS SELECT * FROM "rocpd_kernel_dispatch{{uuid}}";
CREATE VIEW rocpd_memory_copy AS SELECT * FROM "rocpd_memory_copy{{uuid}}";
INSERT INTO "rocpd_metadata{{uuid}}" (tag, value) VALUES ('schema_version', '3'), ('uuid', '{{uuid}}'), ('guid', '{{guid}}');
