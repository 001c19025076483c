-- The traceq store: one DuckDB file holding many traces.
--
-- This file is THE normalized schema, the contract between ingest/ (which writes it) and
-- analysis/ (which reads it). Every reader fills the same columns whatever the source format.
-- Units are in column names (_ns nanoseconds, _bytes bytes, _hz hertz); times are on the
-- trace's own session timeline (nanoseconds since the profiler session began), so
-- `session_start_utc_ns + start_ns` is the wall-clock time. Every event table carries the
-- trace_id of the trace it came from.
--
-- docs/schema.md is generated from the comments here (`python -m traceq.store --markdown`);
-- tests/test_docs.py fails when the two drift. Bump SCHEMA_VERSION in store.py whenever a
-- change here would break an existing store.

-- table traceq_meta: facts about the store itself.
CREATE TABLE traceq_meta (
    key VARCHAR PRIMARY KEY,  -- 'schema_version', 'created_by'
    value VARCHAR             -- the value, as text
);

-- sequence trace_ids: trace ids are never reused, even after `traceq rm`.
CREATE SEQUENCE trace_ids START 1;

-- table traces: one row per loaded trace file.
CREATE TABLE traces (
    trace_id INTEGER PRIMARY KEY,    -- small integer, unique in this store
    name VARCHAR NOT NULL UNIQUE,    -- unique name; the file's stem unless `--name` was given
    source_path VARCHAR NOT NULL,    -- absolute path of the file at load time
    sha256 VARCHAR NOT NULL,         -- hex digest of the file's bytes
    source_bytes BIGINT,             -- file size in bytes
    format VARCHAR NOT NULL,         -- 'nsys' (Nsight Systems SQLite export), 'nvprof', 'kineto' (PyTorch profiler JSON), 'xplane' (JAX/TensorFlow XSpace protobuf), or AMD's (docs/amd.md): 'rocprofv3' (rocprofv3 JSON), 'rocprof-csv' (rocprofv3 kernel_trace.csv, rocprof v1 results.csv), 'rocprof-db' (rocprof v1 results.db), 'rpd' (rocmProfileData), 'rocpd' (rocprofv3's rocpd database); 'pftrace' (a Perfetto protobuf trace, rocprofv3's `--output-format pftrace` among them: docs/perfetto.md)
    tool VARCHAR,                    -- producer, e.g. 'NVIDIA Nsight Systems 2025.3.2.0'; Kineto: its versions, then after '; ' the profiler options its header records (record_shapes, with_stack, profile_memory, with_modules, with_flops); NULL when the file does not say
    source_schema_version VARCHAR,   -- export schema version (nsys EXPORT_SCHEMA_VERSION, nvprof Version, Kineto schemaVersion)
    gpus VARCHAR,                    -- the GPUs that ran kernels, e.g. '2x NVIDIA H200'
    kernel_count BIGINT,             -- rows in kernels for this trace
    start_ns BIGINT,                 -- first GPU activity (kernel, memcpy, memset) start
    end_ns BIGINT,                   -- last GPU activity end
    span_ns BIGINT,                  -- end_ns - start_ns
    session_start_utc_ns BIGINT,     -- wall-clock time of the session's time zero, ns since the Unix epoch (Kineto: baseTimeNanoseconds; NULL when absent, its times then being the epoch's or the host's)
    loaded_at TIMESTAMP,             -- when traceq loaded it (UTC)
    load_seconds DOUBLE,             -- how long the load took
    traceq_version VARCHAR,          -- the traceq that loaded it
    rank INTEGER,                    -- this trace's rank in a distributed job (Kineto distributedInfo); NULL when the file does not say
    world_size INTEGER,              -- ranks in that job (Kineto distributedInfo)
    distributed_backend VARCHAR      -- 'nccl', 'gloo', ... (Kineto distributedInfo)
);

-- table gpus: one row per GPU the trace describes.
CREATE TABLE gpus (
    trace_id INTEGER NOT NULL,
    device_id INTEGER,                     -- the id kernels carry in kernels.device_id
    name VARCHAR,                          -- 'NVIDIA H200'
    vendor VARCHAR,                        -- 'NVIDIA' or 'AMD' (Kineto, AMD's profilers); NULL from nsys and nvprof, which trace NVIDIA GPUs only
    cc_major INTEGER,                      -- compute capability major; NULL on AMD GPUs (their gfx version is not one)
    cc_minor INTEGER,                      -- compute capability minor
    sm_count INTEGER,                      -- streaming multiprocessors
    clock_hz BIGINT,                       -- maximum SM clock (Kineto records none: from the GPU's name where traceq knows it, ingest/kineto.py)
    memory_bytes BIGINT,                   -- device memory
    memory_bandwidth_bytes_per_s BIGINT,   -- peak DRAM bandwidth
    l2_cache_bytes BIGINT,
    threads_per_warp INTEGER,
    max_threads_per_block INTEGER,
    max_warps_per_sm INTEGER,
    max_blocks_per_sm INTEGER,
    max_registers_per_sm INTEGER,
    max_registers_per_block INTEGER,
    max_smem_per_sm_bytes INTEGER,         -- shared memory an SM can carve out at most
    max_smem_per_block_bytes INTEGER,      -- without opt-in (48 KiB)
    max_smem_per_block_optin_bytes INTEGER, -- with cudaFuncAttributeMaxDynamicSharedMemorySize; NULL when unknown
    arch VARCHAR                           -- an AMD GPU's ISA target ('gfx942'), which sets its occupancy limits (rocprofv3 JSON and rocpd: the agent's name); NULL for NVIDIA GPUs and where the trace names none (rocprof v1, RPD, CSV)
);

-- table kernel_events: one row per kernel launch that ran on a GPU, its names, launch configuration and queue as ids (read the `kernels` view: it adds them).
CREATE TABLE kernel_events (
    trace_id INTEGER NOT NULL,
    kernel_id BIGINT NOT NULL,             -- 0-based, in the source file's row order
    start_ns BIGINT NOT NULL,
    end_ns BIGINT NOT NULL,
    correlation_id BIGINT,                 -- links to api_calls.correlation_id within the same pid
    name_id INTEGER NOT NULL,              -- the kernel's names: kernel_names.name_id of the same trace
    config_id INTEGER NOT NULL,            -- the launch's configuration: kernel_configs.config_id of the same trace
    queue_id INTEGER NOT NULL,             -- where it was queued (device, context, stream, process): kernel_queues.queue_id of the same trace
    graph_node_id BIGINT,                  -- CUDA graph node; NULL when not launched from a graph
    launch_start_ns BIGINT,                -- the call that launched it (api_events of the same pid and correlation_id), found at load: its start
    launch_end_ns BIGINT,                  -- its end
    launch_name_id INTEGER,                -- its api_names.name_id
    launch_thread_id INTEGER               -- its api_threads.thread_id; the four NULL where the load found no call (none in the trace, or a reader that does not look: analyses then look it up)
);

-- table kernel_names: the distinct names of each trace's kernels (a launch stores the id; hundreds of names stand for millions of launches).
CREATE TABLE kernel_names (
    trace_id INTEGER NOT NULL,
    name_id INTEGER NOT NULL,              -- 0, 1, ... within the trace
    name VARCHAR NOT NULL,                 -- demangled name, as `nsys stats` shows it
    short_name VARCHAR NOT NULL,           -- base name without namespace, templates or arguments
    mangled_name VARCHAR                   -- raw `_Z...` symbol; NULL when the trace lacks it
);

-- table kernel_configs: the distinct launch configurations of each trace's kernels (a launch stores the id).
CREATE TABLE kernel_configs (
    trace_id INTEGER NOT NULL,
    config_id INTEGER NOT NULL,            -- 0, 1, ... within the trace
    grid_x INTEGER, grid_y INTEGER, grid_z INTEGER,
    block_x INTEGER, block_y INTEGER, block_z INTEGER,
    registers_per_thread INTEGER,
    smem_static_bytes INTEGER,             -- static shared memory per block (Kineto records static + dynamic as one number: it is stored here, dynamic NULL)
    smem_dynamic_bytes INTEGER,            -- dynamic shared memory per block
    smem_carveout_bytes INTEGER,           -- shared memory per SM the driver configured for the launch (sharedMemoryExecuted); NULL when unknown
    smem_optin BOOLEAN,                    -- the function opted in to more than 48 KiB per block (sharedMemoryLimitConfig = OPTIN); NULL when unknown
    local_memory_per_thread_bytes INTEGER,
    local_memory_total_bytes BIGINT,
    launch_type VARCHAR,                   -- 'regular', 'cooperative', 'cooperative_multi_device' or NULL
    kineto_occupancy_pct DOUBLE,           -- Kineto's own `est. achieved occupancy %` of the launch, as the trace wrote it; NULL for other formats
    accum_vgprs INTEGER,                   -- AMD: accumulation VGPRs (AGPRs) per work-item, beside the arch VGPRs in registers_per_thread (rocprofv3 JSON and rocpd: the kernel symbol's accum_vgpr_count; rocprof v1: accum_vgpr; rocprofv3 CSV: Accum_VGPR_Count); NULL for NVIDIA, RPD and where the trace lacks them
    sgprs INTEGER                          -- AMD: scalar registers per wavefront (rocprofv3 JSON and rocpd: sgpr_count; rocprof v1: sgpr; rocprofv3 CSV: SGPR_Count); NULL as accum_vgprs
);

-- table kernel_queues: the distinct places each trace's kernels were queued on: device, context, stream and launching process (a launch stores the id).
CREATE TABLE kernel_queues (
    trace_id INTEGER NOT NULL,
    queue_id INTEGER NOT NULL,             -- 0, 1, ... within the trace
    device_id INTEGER,
    context_id INTEGER,
    stream_id INTEGER,
    pid BIGINT                             -- launching process
);

-- view kernel_rows: the `kernels` view with the launch_* columns of kernel_events as they are (ids), which `kernels` and `kernel_launches` are made of.
CREATE VIEW kernel_rows AS
SELECT e.trace_id, e.kernel_id, e.start_ns, e.end_ns, e.end_ns - e.start_ns AS dur_ns,
       q.device_id, q.context_id, q.stream_id, e.correlation_id, q.pid,
       n.name, n.short_name, n.mangled_name,
       c.grid_x, c.grid_y, c.grid_z, c.block_x, c.block_y, c.block_z,
       c.grid_x::BIGINT * c.grid_y * c.grid_z AS grid_blocks,
       c.block_x * c.block_y * c.block_z AS block_threads,
       c.registers_per_thread, c.smem_static_bytes, c.smem_dynamic_bytes, c.smem_carveout_bytes,
       c.smem_optin, c.local_memory_per_thread_bytes, c.local_memory_total_bytes, c.launch_type,
       e.graph_node_id, c.kineto_occupancy_pct, c.accum_vgprs, c.sgprs,
       e.launch_start_ns, e.launch_end_ns, e.launch_name_id, e.launch_thread_id
FROM kernel_events e
JOIN kernel_names n ON n.trace_id = e.trace_id AND n.name_id = e.name_id
JOIN kernel_configs c ON c.trace_id = e.trace_id AND c.config_id = e.config_id
JOIN kernel_queues q ON q.trace_id = e.trace_id AND q.queue_id = e.queue_id;

-- view kernels: one row per kernel launch, as analyses read it: the columns of kernel_events but name_id, config_id, queue_id and the launch_* ones (the `kernel_launches` view resolves those), with name, short_name and mangled_name from kernel_names, the launch configuration from kernel_configs, device, context, stream and pid from kernel_queues, dur_ns = end_ns - start_ns, grid_blocks = grid_x * grid_y * grid_z (BIGINT) and block_threads = block_x * block_y * block_z.
CREATE VIEW kernels AS
SELECT * EXCLUDE (launch_start_ns, launch_end_ns, launch_name_id, launch_thread_id) FROM kernel_rows;

-- table kernel_summary: per-name kernel statistics of each trace, written by the load (traceq.analysis.kernels.top.build_kernel_summary) so that `traceq top` reads a few rows instead of every launch.
CREATE TABLE kernel_summary (
    trace_id INTEGER NOT NULL,
    name_by VARCHAR NOT NULL,              -- which name groups the launches: 'demangled', 'short' or 'mangled' (`traceq top --by`)
    name VARCHAR NOT NULL,                 -- kernels.name, short_name, or mangled_name (name when the trace lacks it)
    instances BIGINT NOT NULL,             -- launches
    total_ns BIGINT NOT NULL,              -- sum of dur_ns
    pct DOUBLE,                            -- total_ns as a share of all kernel time in the trace, %
    avg_ns DOUBLE NOT NULL,
    median_ns DOUBLE NOT NULL,             -- interpolated between the two middle values, as `nsys stats`
    min_ns BIGINT NOT NULL,
    max_ns BIGINT NOT NULL,
    stddev_ns DOUBLE NOT NULL              -- sample standard deviation; 0 for a single launch
);

-- table api_events: CUDA runtime and driver API calls on the CPU, their names and threads as ids (read the `api_calls` view: it adds them).
CREATE TABLE api_events (
    trace_id INTEGER NOT NULL,
    start_ns BIGINT NOT NULL,
    end_ns BIGINT NOT NULL,
    name_id INTEGER NOT NULL,              -- the call's API and name: api_names.name_id of the same trace
    thread_id INTEGER NOT NULL,            -- the calling thread: api_threads.thread_id of the same trace
    correlation_id BIGINT,
    return_value BIGINT
);

-- table api_names: the distinct API functions of each trace's calls.
CREATE TABLE api_names (
    trace_id INTEGER NOT NULL,
    name_id INTEGER NOT NULL,              -- 0, 1, ... within the trace
    api VARCHAR NOT NULL,                  -- 'runtime', 'driver' or 'other'
    name VARCHAR                           -- 'cudaLaunchKernel_v7000', 'cuLaunchKernelEx', ...
);

-- table api_threads: the distinct threads that made each trace's API calls.
CREATE TABLE api_threads (
    trace_id INTEGER NOT NULL,
    thread_id INTEGER NOT NULL,            -- 0, 1, ... within the trace
    pid BIGINT,                            -- calling process
    tid BIGINT,                            -- calling thread (operating-system id, unsigned)
    global_tid BIGINT                      -- nsys globalTid (hardware, VM, pid and tid packed); NULL for nvprof
);

-- view api_calls: CUDA runtime and driver API calls, as analyses read them: the columns of api_events but name_id and thread_id, with api and name from api_names, pid, tid and global_tid from api_threads, and dur_ns = end_ns - start_ns.
CREATE VIEW api_calls AS
SELECT e.trace_id, e.start_ns, e.end_ns, e.end_ns - e.start_ns AS dur_ns, n.api, n.name,
       e.correlation_id, t.pid, t.tid, t.global_tid, e.return_value
FROM api_events e
JOIN api_names n ON n.trace_id = e.trace_id AND n.name_id = e.name_id
JOIN api_threads t ON t.trace_id = e.trace_id AND t.thread_id = e.thread_id;

-- table memops: memory copies and memsets on the GPU.
CREATE TABLE memops (
    trace_id INTEGER NOT NULL,
    start_ns BIGINT NOT NULL,
    end_ns BIGINT NOT NULL,
    dur_ns BIGINT NOT NULL,
    op VARCHAR NOT NULL,                   -- 'memcpy' or 'memset'
    copy_kind VARCHAR,                     -- memcpy: 'Host-to-Device', 'Device-to-Host', 'Device-to-Device', ... (the words `nsys stats` uses)
    src_kind VARCHAR,                      -- memcpy: 'Pageable', 'Pinned', 'Device', ...
    dst_kind VARCHAR,                      -- memcpy: as src_kind; memset: the memory set
    bytes BIGINT,
    value INTEGER,                         -- memset: the byte value
    device_id INTEGER,
    context_id INTEGER,
    stream_id INTEGER,
    correlation_id BIGINT,
    pid BIGINT
);

-- table nvtx_events: NVTX ranges and marks, their kind, domain, category, color and threads as an id (read the `nvtx` view: it adds them). Kineto's cpu_op, user_annotation (ProfilerStep#N, Optimizer.step) and, when asked, python_function events are push/pop ranges of their thread, its gpu_user_annotation events start/end ranges of no process; the domain is the Kineto category.
CREATE TABLE nvtx_events (
    trace_id INTEGER NOT NULL,
    start_ns BIGINT NOT NULL,
    end_ns BIGINT,                         -- NULL for marks
    name VARCHAR,                          -- the message text
    attributes_id INTEGER NOT NULL         -- nvtx_attributes.attributes_id of the same trace
);

-- table nvtx_attributes: the distinct (kind, domain, category, color, threads) of each trace's NVTX events (an event stores the id).
CREATE TABLE nvtx_attributes (
    trace_id INTEGER NOT NULL,
    attributes_id INTEGER NOT NULL,        -- 0, 1, ... within the trace
    kind VARCHAR NOT NULL,                 -- 'pushpop' (per-thread stack), 'startend' (may cross threads) or 'mark'
    domain VARCHAR,                        -- NVTX domain name; NULL for the default domain; Kineto: the event's category ('cpu_op', 'user_annotation', ...)
    category BIGINT,
    color BIGINT,                          -- ARGB
    pid BIGINT,
    tid BIGINT,                            -- thread that opened the range
    global_tid BIGINT,                     -- nsys globalTid; NULL for nvprof
    end_tid BIGINT                         -- thread that closed a start/end range
);

-- view nvtx: NVTX ranges and marks, as analyses read them: the columns of nvtx_events but attributes_id, with dur_ns = end_ns - start_ns (NULL for marks) and the columns of nvtx_attributes.
CREATE VIEW nvtx AS
SELECT e.trace_id, e.start_ns, e.end_ns, e.end_ns - e.start_ns AS dur_ns, a.kind, e.name, a.domain,
       a.category, a.color, a.pid, a.tid, a.global_tid, a.end_tid
FROM nvtx_events e
JOIN nvtx_attributes a ON a.trace_id = e.trace_id AND a.attributes_id = e.attributes_id;

-- table memory_events: device memory allocations and frees (nsys --cuda-memory-usage=true; Kineto profile_memory=True, from PyTorch's allocator: the bytes allocated before its first event are one allocation at that event's time).
CREATE TABLE memory_events (
    trace_id INTEGER NOT NULL,
    ts_ns BIGINT NOT NULL,
    op VARCHAR NOT NULL,                   -- 'alloc' or 'free'
    bytes BIGINT,
    address UBIGINT,
    mem_kind VARCHAR,                      -- 'Device', 'Managed', 'Pinned', ...
    device_id INTEGER,
    context_id INTEGER,
    stream_id INTEGER,
    correlation_id BIGINT,
    pid BIGINT,
    tid BIGINT                             -- the allocating thread where the trace records it (Kineto); nsys's calls are found by correlation_id
);

-- table gpu_metrics: GPU metrics sampled by Nsight Systems (`nsys profile --gpu-metrics-devices=...`: its GPU_METRICS and TARGET_INFO_GPU_METRICS tables), the percentage ('[Throughput %]') metrics only; a sample's value holds from its time until the device's next sample of that metric (docs/gpu-metrics.md). A store made before it existed gets it at its first load of such a trace.
CREATE TABLE gpu_metrics (
    trace_id INTEGER NOT NULL,
    device_id INTEGER,                     -- the GPU sampled (kernels.device_id): the trace's one GPU, else the low byte of nsys's typeId
    ts_ns BIGINT NOT NULL,                 -- sample time
    metric VARCHAR NOT NULL,               -- the metric's name as nsys gives it: 'SMs Active [Throughput %]', 'Tensor Active [Throughput %]', 'DRAM Read Bandwidth [Throughput %]', ...
    value DOUBLE                           -- percent, 0 to 100
);

-- table operators: PyTorch operators with recorded shapes (Kineto cpu_op events under record_shapes=True or with_flops=True); their ranges are in nvtx too.
CREATE TABLE operators (
    trace_id INTEGER NOT NULL,
    pid BIGINT,
    tid BIGINT,
    start_ns BIGINT NOT NULL,
    end_ns BIGINT NOT NULL,
    name VARCHAR,                          -- 'aten::conv2d'
    sequence_number BIGINT,                -- autograd sequence number: links a forward op to its backward
    external_id BIGINT,                    -- Kineto's External id: the kernels and calls the op launched carry it
    input_dims VARCHAR,                    -- JSON list of each input's shape, as the trace wrote it
    input_types VARCHAR,                   -- JSON list of each input's type ('float', 'ScalarList', ...)
    concrete_inputs VARCHAR,               -- JSON list of scalar inputs' values as text (stride, padding, ...); NULL in older traces
    flops BIGINT                           -- PyTorch's own FLOP count (with_flops=True); NULL where it wrote none
);

-- table collectives: arguments of collective communication (NCCL, RCCL, gloo) that Kineto writes on collective kernels and on `record_param_comms` operators, and PyTorch's `nccl:<collective>` annotations with their tensor (older traces, whose operators carry none).
CREATE TABLE collectives (
    trace_id INTEGER NOT NULL,
    kernel_id BIGINT,                      -- the kernel (kernels.kernel_id); NULL for an operator's row
    event VARCHAR NOT NULL,                -- 'kernel', 'cpu_op' or 'user_annotation'
    pid BIGINT,                            -- an operator's process and thread (NULL for kernels)
    tid BIGINT,
    start_ns BIGINT NOT NULL,
    end_ns BIGINT NOT NULL,
    collective VARCHAR,                    -- Collective name: 'allreduce', '_allgather_base', 'broadcast', ...
    in_msg_nelems BIGINT,                  -- elements sent (an annotation's: its first input tensor's)
    out_msg_nelems BIGINT,                 -- elements received
    in_split_size VARCHAR,                 -- all-to-all splits, as the trace wrote them ('[]' when none)
    out_split_size VARCHAR,
    group_size BIGINT,                     -- ranks in the process group
    dtype VARCHAR,                         -- element type ('Float', 'BFloat16', ...)
    pg_name VARCHAR,                       -- process group name (or id in older traces)
    pg_desc VARCHAR,                       -- process group description ('default_pg', ...)
    pg_ranks VARCHAR                       -- the group's global ranks, as the trace wrote them ('[0, 1]')
);

-- table process_groups: the process groups of a distributed trace (Kineto distributedInfo.pg_config).
CREATE TABLE process_groups (
    trace_id INTEGER NOT NULL,
    pg_name VARCHAR,
    pg_desc VARCHAR,
    backend_config VARCHAR,                -- 'cuda:nccl', 'cpu:gloo,cuda:gloo', ...
    pg_size BIGINT,
    ranks BIGINT[]                         -- global ranks in the group
);

-- table graph_nodes: CUDA graph node events (nsys CUDA_GRAPH_NODE_EVENTS, with --cuda-graph-trace=node): a node created when a graph was built or captured, or cloned from one when it was instantiated; a replayed kernel's graph_node_id leads through them to the capture (analysis.structure.graphs).
CREATE TABLE graph_nodes (
    trace_id INTEGER NOT NULL,
    graph_node_id BIGINT NOT NULL,         -- the node: kernel_events.graph_node_id of the kernels it runs
    original_graph_node_id BIGINT,         -- the node it was cloned from; NULL for a node created, not cloned
    created_ns BIGINT NOT NULL,            -- when the event happened (for a captured node: during the call that was captured)
    pid BIGINT,                            -- process and thread that created or cloned it
    tid BIGINT
);

-- table processes: processes the trace names.
CREATE TABLE processes (
    trace_id INTEGER NOT NULL,
    pid BIGINT,
    name VARCHAR
);

-- table threads: threads the trace names.
CREATE TABLE threads (
    trace_id INTEGER NOT NULL,
    pid BIGINT,
    tid BIGINT,
    name VARCHAR
);

-- sequence run_ids: run ids are never reused.
CREATE SEQUENCE run_ids START 1;

-- table runs: one row per run: the ranks of one distributed job loaded together (`traceq load FILE... --run NAME`, one transaction), or one trace loaded alone (its ranks are then its processes or GPUs that ran kernels).
CREATE TABLE runs (
    run_id INTEGER PRIMARY KEY,
    name VARCHAR NOT NULL UNIQUE,    -- the --run name, or the trace's name when it was loaded alone
    world_size INTEGER NOT NULL,     -- ranks the run holds
    clock VARCHAR NOT NULL           -- how the ranks' times were put on one clock: 'one trace' (one file, one clock) or 'collective ends' (each rank file shifted so that the collectives it shares with rank 0 end when rank 0's do)
);

-- table ranks: one row per rank of a run: which trace holds its events, and within it which process and GPU.
CREATE TABLE ranks (
    run_id INTEGER NOT NULL,
    rank INTEGER NOT NULL,           -- the rank in the job
    trace_id INTEGER NOT NULL,
    pid BIGINT,                      -- the rank's process in the trace; NULL: every process of the trace
    device_id INTEGER,               -- the rank's GPU; NULL: every GPU of the trace
    rank_from VARCHAR NOT NULL,      -- where the rank comes from: 'distributedInfo' (Kineto), 'device and process ids' (the order of the GPUs, then processes, that ran NCCL kernels, else any kernels), 'one GPU'
    shift_ns BIGINT NOT NULL,        -- added to the trace's times to put them on the run's clock (rank 0's trace), at shift_at_ns; 0 within one trace
    drift_ppm DOUBLE NOT NULL,       -- how much faster rank 0's clock ran, in millionths: the shift grows by drift_ppm x 1e-6 x (t - shift_at_ns); 0 unless the collectives span a second or more
    shift_at_ns BIGINT NOT NULL,     -- the trace's own time at which shift_ns holds (its first collective matched with rank 0's)
    shift_collectives INTEGER,       -- collectives the shift was measured on (matched with rank 0's); NULL when no shift was needed
    shift_residual_ns BIGINT         -- after the shift, the median |end on this rank - end on rank 0| over those collectives
);

-- view kernel_launches: each kernel with the runtime or driver call that launched it: the one the load found (kernel_events.launch_*), else the calls joined on (pid, correlation_id) (a kernel of a reader that finds none at load, or one launched by a call not named as a launch).
CREATE VIEW kernel_launches AS
SELECT k.* EXCLUDE (launch_start_ns, launch_end_ns, launch_name_id, launch_thread_id),
       t.tid AS launch_tid, n.name AS launch_api, k.launch_start_ns, k.launch_end_ns
FROM kernel_rows k
JOIN api_threads t ON t.trace_id = k.trace_id AND t.thread_id = k.launch_thread_id
JOIN api_names n ON n.trace_id = k.trace_id AND n.name_id = k.launch_name_id
UNION ALL (
    -- the kernels joined to api_events first: DuckDB then skips that scan when none is left
    WITH unlinked AS (SELECT * FROM kernel_rows WHERE launch_thread_id IS NULL), calls AS (
        SELECT u.trace_id, u.kernel_id, t.tid, n.name, a.start_ns, a.end_ns
        FROM unlinked u
        JOIN api_events a ON a.trace_id = u.trace_id AND a.correlation_id = u.correlation_id
        JOIN api_threads t ON t.trace_id = a.trace_id AND t.thread_id = a.thread_id AND t.pid = u.pid
        JOIN api_names n ON n.trace_id = a.trace_id AND n.name_id = a.name_id AND n.api IN ('runtime', 'driver'))
    SELECT u.* EXCLUDE (launch_start_ns, launch_end_ns, launch_name_id, launch_thread_id),
           c.tid AS launch_tid, c.name AS launch_api, c.start_ns AS launch_start_ns, c.end_ns AS launch_end_ns
    FROM unlinked u LEFT JOIN calls c ON c.trace_id = u.trace_id AND c.kernel_id = u.kernel_id);

-- table attributions: the traces whose kernel attribution the store keeps (`traceq attribute`; `traceq load` for traces of up to 1M kernels), and what it was made with: analyses read it only when their iteration regex and the fingerprint in force are these.
CREATE TABLE attributions (
    trace_id INTEGER NOT NULL,
    iteration_regex VARCHAR NOT NULL,      -- the regex that named iteration ranges (the default one)
    fingerprint VARCHAR NOT NULL,          -- sha256 of traceq's attributing modules and packaged kernel rules (traceq.analysis.structure.stored.fingerprint)
    seconds DOUBLE,                        -- how long attributing took
    kernels BIGINT                         -- kernels attributed
);

-- table kernel_contexts: the distinct attribution contexts of each trace's kernels (a kernel stores the id in kernel_attribution).
CREATE TABLE kernel_contexts (
    trace_id INTEGER NOT NULL,
    context_id INTEGER NOT NULL,           -- 0, 1, ... within the trace
    layer VARCHAR,                         -- innermost NVTX layer range around the launch (`traceq layers`), or the layer a rule gave; NULL: none
    pass VARCHAR,                          -- 'forward', 'backward' or NULL
    iteration VARCHAR,                     -- the enclosing iteration range's name ('iteration 3', 'ProfilerStep#3')
    stage VARCHAR,                         -- 'data_copy', 'forward', 'backward', 'weight_update' or 'other'
    library VARCHAR,                       -- by the operation that launched the kernel where a [[launcher]] rule says, else by its name (`traceq libs`)
    precision VARCHAR,                     -- 'fp64', 'fp32', 'tf32', 'fp16', 'bf16', 'fp8' or 'int8', as `traceq ce` reads it without --spec or --precision
    precision_from VARCHAR,                -- 'kernel name', 'operator dtype', 'assumed float32' or 'unknown' (attention, precision null)
    attribution VARCHAR                    -- 'range' (inside a layer range), 'rule: ...' (the rule that gave the layer) or 'none: ...' (why there is none)
);

-- table kernel_classes: what each kernel name of a trace in attributions says, by the packaged kernel rules.
CREATE TABLE kernel_classes (
    trace_id INTEGER NOT NULL,
    name VARCHAR NOT NULL,                 -- kernel_names.name
    implementation VARCHAR,                -- the library the name says ('cuDNN', 'cuBLAS', 'PyTorch ATen', ...)
    operation VARCHAR                      -- 'convolution', 'gemm', 'elementwise', ...
);

-- table kernel_attribution: each kernel's attribution context, for the traces in attributions.
CREATE TABLE kernel_attribution (
    trace_id INTEGER NOT NULL,
    kernel_id BIGINT NOT NULL,             -- kernel_events.kernel_id
    context_id INTEGER NOT NULL            -- kernel_contexts.context_id of the same trace
);

-- view kernels_attributed: the kernels view with each launch's kept attribution (traces in attributions only): layer, pass, iteration, stage, library, implementation (the library its name says), operation, precision, precision_from and attribution, e.g. `SELECT layer, sum(dur_ns) FROM kernels_attributed WHERE trace_id = 1 GROUP BY layer`.
CREATE VIEW kernels_attributed AS
SELECT k.*, c.layer, c.pass, c.iteration, c.stage, c.library, s.implementation, s.operation,
       c.precision, c.precision_from, c.attribution
FROM kernels k
JOIN kernel_attribution a ON a.trace_id = k.trace_id AND a.kernel_id = k.kernel_id
JOIN kernel_contexts c ON c.trace_id = a.trace_id AND c.context_id = a.context_id
LEFT JOIN kernel_classes s ON s.trace_id = k.trace_id AND s.name = k.name;

-- table ncu_reports: the Nsight Compute report joined to each trace (`traceq load --ncu REPORT --into TRACE`; a later one replaces it). Stores made before it existed get it at their first --ncu load.
CREATE TABLE ncu_reports (
    trace_id INTEGER NOT NULL,
    source_path VARCHAR NOT NULL,          -- absolute path of the report at load time (.csv, .csv.gz or .ncu-rep)
    sha256 VARCHAR NOT NULL,
    launches BIGINT NOT NULL,              -- profiled launches in the report
    matched BIGINT NOT NULL,               -- of them, joined to a kernel of the trace
    extended BIGINT NOT NULL,              -- kernels given a measured launch's values by --ncu-extend (0 without it)
    metrics VARCHAR,                       -- the ncu_metrics columns the report had, comma-separated
    loaded_at TIMESTAMP
);

-- table ncu_metrics: Nsight Compute's measured metrics of each kernel launch it profiled, joined to the trace's kernel by name (demangled, mangled or short, as ncu wrote it), grid and block, the NVTX push/pop stack where both recorded one, and launch order within those; with --ncu-extend also the unprofiled launches of a measured name and configuration. Units are ncu's converted by the report's unit row; a metric the report lacks is NULL.
CREATE TABLE ncu_metrics (
    trace_id INTEGER NOT NULL,
    kernel_id BIGINT NOT NULL,             -- kernel_events.kernel_id
    ncu_id BIGINT,                         -- the report's ID of the measured launch; NULL for an extended one
    matched_by VARCHAR NOT NULL,           -- 'launch' (this launch was profiled) or 'extended' (the mean of the profiled launches of its name, grid, block and innermost NVTX range, else of its name, grid and block)
    gpu_time_ns DOUBLE,                    -- gpu__time_duration.sum (under the profiler: caches flushed, clocks as ncu set them)
    achieved_occupancy_pct DOUBLE,         -- sm__warps_active.avg.pct_of_peak_sustained_active
    theoretical_occupancy_pct DOUBLE,      -- sm__maximum_warps_per_active_cycle_pct
    sm_throughput_pct DOUBLE,              -- sm__throughput.avg.pct_of_peak_sustained_elapsed
    tensor_pipe_pct DOUBLE,                -- sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed (or the hmma pipe's)
    memory_throughput_pct DOUBLE,          -- gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed
    dram_throughput_pct DOUBLE,            -- gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed
    dram_read_bytes DOUBLE,                -- dram__bytes_read.sum
    dram_write_bytes DOUBLE,               -- dram__bytes_write.sum
    l2_bytes DOUBLE,                       -- lts__t_bytes.sum
    l1_bytes DOUBLE,                       -- l1tex__t_bytes.sum
    global_sectors DOUBLE,                 -- memory_l2_theoretical_sectors_global: the L2 sectors the kernel's global loads and stores asked for (ncu's SourceCounters)
    global_sectors_ideal DOUBLE,           -- memory_l2_theoretical_sectors_global_ideal: the sectors the same accesses would need, coalesced
    l2_cycles_active DOUBLE,               -- lts__cycles_active.sum
    l2_cycles_elapsed DOUBLE               -- lts__cycles_elapsed.sum
);
