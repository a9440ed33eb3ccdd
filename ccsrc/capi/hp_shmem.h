/* The runtime's C ABI: the seam between the C++ runtime and a framework handler that cannot share its C++ ABI.
 *
 * MindSpore's extensions are built with the pre-C++11 library ABI and torch's with the C++11 one, so the two
 * framework handlers cannot link one C++ library. This header is plain C: every handler other than torch's (whose
 * binding links the runtime directly) reaches the runtime through it, in libhp_shmem_c.so.
 *
 * Conventions:
 *  - Every function returns an hp_shmem_status (HP_SHMEM_OK, or the runtime's StatusCode); on failure
 *    hp_shmem_last_error() gives the message ("`x` must be y, but got z" or "<fact>: key=value ...").
 *  - Each call runs on the calling thread and completes before it returns (the host device's default stream):
 *    buffers may be reused as soon as a call returns.
 *  - Addresses are this process's. A symmetric address lies inside an active allocation of this lifecycle. A data
 *    buffer may be NULL only with zero bytes (an empty tensor has no data pointer).
 *  - "Collective over X" means every rank of X makes the same call in the same order; ranks that disagree find out
 *    (HP_SHMEM_MISMATCH on every rank) and nothing is written.
 *  - Every wait is bounded by HYPER_PARALLEL_SHMEM_TIMEOUT_SEC (HP_SHMEM_TIMEOUT naming what was missing).
 */
#ifndef HP_SHMEM_CAPI_HP_SHMEM_H_
#define HP_SHMEM_CAPI_HP_SHMEM_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HP_SHMEM_API __attribute__((visibility("default")))

/* Bumped on every incompatible change; a caller checks it before anything else. */
#define HP_SHMEM_ABI_VERSION 9

/* The runtime's StatusCode values (runtime/status.h), asserted equal there. */
typedef enum {
  HP_SHMEM_OK = 0,
  HP_SHMEM_INVALID_ARGUMENT = 1,
  HP_SHMEM_TYPE_ERROR = 2,
  HP_SHMEM_STATE_ERROR = 3,
  HP_SHMEM_TIMEOUT = 4,
  HP_SHMEM_OUT_OF_MEMORY = 5,
  HP_SHMEM_MISMATCH = 6,
  HP_SHMEM_DEVICE_ERROR = 7,
  HP_SHMEM_INTERNAL = 8,
  HP_SHMEM_INTERRUPTED = 9,
} hp_shmem_status;

/* How ranks exchange bytes at initialisation and team creation: the framework's own process group, as callbacks.
 * Each callback returns HP_SHMEM_OK, or a failure code (HP_SHMEM_TIMEOUT, HP_SHMEM_DEVICE_ERROR) after writing a
 * NUL-terminated message of at most `error_bytes` bytes into `error`. */
typedef struct {
  void* context;
  int rank;         /* this rank inside the exchanging group */
  int world_size;   /* ranks of the exchanging group */
  /* Every rank contributes `bytes` bytes of `in`; `out` receives world_size * bytes, in rank order. */
  int (*all_gather)(void* context, const void* in, size_t bytes, void* out, char* error, size_t error_bytes);
  int (*barrier)(void* context, char* error, size_t error_bytes);
} hp_shmem_bootstrap;

/* An element type as the engine names it in fingerprints and messages. `reduce_dtype` is an hp_shmem_dtype for
 * types that reduce, -1 for those that only move (all_gather, all_to_all of any type). */
typedef struct {
  const char* name;   /* "float32", at most 23 characters */
  size_t bytes;       /* bytes per element */
  int reduce_dtype;
} hp_shmem_element_type;

/* The element types the runtime reduces: ops::DataType's values (ops/reduce_op.h), asserted equal there. */
typedef enum {
  HP_SHMEM_FLOAT32 = 0,
  HP_SHMEM_FLOAT64 = 1,
  HP_SHMEM_FLOAT16 = 2,
  HP_SHMEM_BFLOAT16 = 3,
  HP_SHMEM_INT8 = 4,
  HP_SHMEM_UINT8 = 5,
  HP_SHMEM_INT32 = 6,
  HP_SHMEM_INT64 = 7,
} hp_shmem_dtype;

/* What a collective call is for (CallRole, runtime/team.h, asserted equal there): part of what the members agree
 * on, so that a gradient's collective never pairs with a forward one. */
typedef enum {
  HP_SHMEM_ROLE_FORWARD = 0,
  HP_SHMEM_ROLE_BACKWARD = 1,
  HP_SHMEM_ROLE_FUSED_GATHER = 2,
  HP_SHMEM_ROLE_FUSED_SCATTER = 3,
} hp_shmem_role;

/* The wire format a reduction travels in (the runtime's wire_formats numbering, as fingerprints carry it): the
 * tensor's own dtype, or a low-precision format. */
typedef enum {
  HP_SHMEM_WIRE_FULL = 0,
  HP_SHMEM_WIRE_FLOAT8_E4M3FN = 1,
  HP_SHMEM_WIRE_FLOAT8_E5M2 = 2,
  HP_SHMEM_WIRE_FLOAT16 = 3,
  HP_SHMEM_WIRE_BFLOAT16 = 4,
} hp_shmem_wire;

/* ReduceOp (sum, avg, max, min), SignalOp (set, add), CompareOp (eq, ne, gt, ge, lt, le) and Collective keep the
 * runtime's values. Every numbering of this header, by name, is what hp_shmem_numberings_json returns: a caller reads
 * the numbers from there rather than writing them again. */

typedef struct {
  uint64_t id;            /* never reused, not even across lifecycles */
  void* address;          /* this rank's copy */
  uint64_t bytes;
  uint64_t heap_offset;   /* the same on every rank */
} hp_shmem_allocation;

HP_SHMEM_API int hp_shmem_abi_version(void);
/* The message of this thread's latest failed call ("" if none); valid until this thread's next call. */
HP_SHMEM_API const char* hp_shmem_last_error(void);
/* The name of a status code as the runtime spells it ("INVALID_ARGUMENT"), "UNKNOWN" for other values. */
HP_SHMEM_API const char* hp_shmem_status_name(int status);

/* Every numbering the runtime's calls take or return (status_codes, dtypes, reduce_ops, signal_ops, compare_ops,
 * wire_formats, call_roles, collectives, lifecycle_states: hp_shmem_state's) as one JSON object of name -> number
 * objects. Buffer protocol as hp_shmem_debug_state_json. */
HP_SHMEM_API int hp_shmem_numberings_json(char* buffer, size_t capacity, size_t* needed);
/* The configuration a lifecycle starting now would use, read from the environment by the runtime (the one reader of
 * every variable, aliases included) as the JSON object debug_state's "config" is. A bad variable fails with its
 * message. Buffer protocol as hp_shmem_debug_state_json. */
HP_SHMEM_API int hp_shmem_read_config_json(char* buffer, size_t capacity, size_t* needed);
/* The default wire format of the user API's reductions (SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE) as an hp_shmem_wire:
 * the lifecycle's, read once at init, or the environment's while none is active. A bad name fails here. */
HP_SHMEM_API int hp_shmem_low_precision_default(int* wire);
/* The runtime's log level (0 debug .. 3 error), as the lifecycle set it. */
HP_SHMEM_API int hp_shmem_log_level(void);

/* Lifecycle. Collective over `bootstrap` (the root: every rank of the job, rank = PE): starts a lifecycle on the
 * device HYPER_PARALLEL_SHMEM_DEVICE names, with the heap HYPER_PARALLEL_SHMEM_HEAP_SIZE sets, or `heap_size` bytes
 * when it is not 0 (an explicit choice of the caller's; the same limits apply). */
HP_SHMEM_API int hp_shmem_init(const hp_shmem_bootstrap* bootstrap, size_t heap_size);
/* Collective over the root: refused alike on every rank while any rank holds live allocations. */
HP_SHMEM_API int hp_shmem_shutdown(const hp_shmem_bootstrap* bootstrap);
/* 0 uninitialised, 1 initialised, 2 failed (terminal). */
HP_SHMEM_API int hp_shmem_state(void);
HP_SHMEM_API int hp_shmem_rank(void);
HP_SHMEM_API int hp_shmem_world_size(void);

/* Collective over the root: a symmetric allocation, checked against every rank's. `call_site` is logged. */
HP_SHMEM_API int hp_shmem_allocate(size_t bytes, size_t alignment, const char* call_site, hp_shmem_allocation* out);
/* Collective over the root: frees an active allocation, checked against every rank's. */
HP_SHMEM_API int hp_shmem_free(uint64_t allocation_id, const char* call_site);
/* Where [symmetric, symmetric + bytes) lies on `pe` (a rank of this rank's node). Local, orders nothing. */
HP_SHMEM_API int hp_shmem_peer_address(const void* symmetric, size_t bytes, int pe, void** out);

/* One-sided data plane. Local calls; `pe` is a root rank on this rank's node. Zero bytes are checked no-ops. */
HP_SHMEM_API int hp_shmem_put(void* symmetric_dst, const void* src, size_t dst_bytes, size_t src_bytes, int pe);
HP_SHMEM_API int hp_shmem_get(void* dst, const void* symmetric_src, size_t dst_bytes, size_t src_bytes, int pe);
/* `signal_bytes` 4 or 8: an int32 or int64 signal, naturally aligned, inside an allocation. Ordered after this
 * rank's earlier puts to `pe`. */
HP_SHMEM_API int hp_shmem_signal(void* symmetric_signal, int signal_bytes, int64_t value, int signal_op, int pe);
/* hp_shmem_put, then hp_shmem_signal on the same `pe`, as one operation: the data is visible on `pe` before the
 * signal is, and every check of both halves passes before anything is written. Across nodes one round trip. */
HP_SHMEM_API int hp_shmem_put_with_signal(void* symmetric_dst, const void* src, size_t dst_bytes, size_t src_bytes,
                                          void* symmetric_signal, int signal_bytes, int64_t value, int signal_op,
                                          int pe);
HP_SHMEM_API int hp_shmem_wait_signal(const void* symmetric_signal, int signal_bytes, int compare_op, int64_t value);
/* Collective over the root's ranks of this node: every earlier put is visible everywhere after it. */
HP_SHMEM_API int hp_shmem_barrier(void);

/* One PE's part of hp_shmem_exchange_messages: what goes to it, where its message lands, and how that went. */
typedef struct {
  int pe;                   /* a root rank of another node that the device reaches */
  const void* send;         /* NULL: nothing is sent (an empty message needs a pointer) */
  size_t send_bytes;
  void* receive;            /* NULL: nothing is received */
  size_t receive_capacity;
  size_t received;          /* out: the received message's length */
  int status;               /* out: HP_SHMEM_OK, or the code of this exchange's failure */
} hp_shmem_message_exchange;

/* Two-sided messages with PEs of other nodes (the host device's transport across nodes; the phase across nodes of
 * the handlers' collectives). For each exchange: `send_bytes` at `send` to `pe` as one message under `tag`, and the
 * next message that `pe` sent this rank under `tag` into `receive`, at most `receive_capacity` bytes. Not collective
 * (each PE of a pair calls it); every exchange is posted at once and all complete or fail within one timeout. A
 * refusal (a PE this device does not reach, a tag of 2^40 or more) returns its code with nothing sent. Otherwise
 * HP_SHMEM_OK, each exchange's own outcome in its `status` (a PE found gone fails at once, a longer message than the
 * room fails), and hp_shmem_last_error() the message of the first exchange that failed ("" when none did). */
HP_SHMEM_API int hp_shmem_exchange_messages(uint64_t tag, hp_shmem_message_exchange* exchanges, size_t count);
/* dst[i] = op over `pes` (in their order) of symmetric_src[i] on each pe. */
HP_SHMEM_API int hp_shmem_reduce(void* dst, size_t dst_bytes, const void* symmetric_src, size_t src_bytes, int dtype,
                                 int reduce_op, const int* pes, int npes);

/* Teams: the members' PEs in group-rank order. Collective over `bootstrap` (rank = group rank). */
HP_SHMEM_API int hp_shmem_team_create(const int* pes, int npes, const hp_shmem_bootstrap* bootstrap, uint64_t* team);
/* A node team: this node's members (`pes`) of a team that spans nodes, whose every PE `serves` lists in its group-rank
 * order (holding every PE of `pes`; the same on every member). Its messages name that whole team:
 * "team_ranks=[0,1,2,3] node_team_ranks=[0,1]". Collective over `bootstrap` (rank = group rank in `pes`). */
HP_SHMEM_API int hp_shmem_node_team_create(const int* pes, int npes, const int* serves, int nserves,
                                           const hp_shmem_bootstrap* bootstrap, uint64_t* team);
/* Local, never waits; later calls on the team are refused. */
HP_SHMEM_API int hp_shmem_team_release(uint64_t team);

/* The collective engine, one call each; collective over the team. Buffers are local; a buffer inside an active
 * allocation at the same heap offset on every member takes the copy-free path. `role`: an hp_shmem_role. An argument
 * refused by one member fails the call on every member, naming it; a member that gives a call up (its wait timed
 * out) makes it fail on every member (docs/engine.md). */
HP_SHMEM_API int hp_shmem_team_barrier(uint64_t team, int role);
HP_SHMEM_API int hp_shmem_all_gather(uint64_t team, void* output, size_t output_bytes, const void* input,
                                     size_t input_bytes, const hp_shmem_element_type* type, int role);
/* `input` NULL: in place on `tensor`; otherwise `bytes` of input reduced into `tensor` (no overlap). */
HP_SHMEM_API int hp_shmem_all_reduce(uint64_t team, void* tensor, const void* input, size_t bytes, int dtype,
                                     int reduce_op, int wire, int role);
HP_SHMEM_API int hp_shmem_reduce_scatter(uint64_t team, void* output, size_t output_bytes, const void* input,
                                         size_t input_bytes, int dtype, int reduce_op, int wire, int role);
/* sends[j] (send_bytes[j] bytes) goes to group rank j; `receive` gets rank i's part after receive_counts[<i]
 * elements. Counts are checked across members before anything is written. */
HP_SHMEM_API int hp_shmem_all_to_all(uint64_t team, const void* const* sends, const size_t* send_bytes, int nsends,
                                     void* receive, size_t receive_bytes, const uint64_t* receive_counts, int ncounts,
                                     const hp_shmem_element_type* type, int role);
/* MoE dispatch (`direction` 0) or combine (1), collective over the team (runtime/collectives/moe.h for the layouts):
 * `input` and `output` hold rows of `row_bytes` bytes; `in_splits`, `in_offsets` (NULL: packed in split order),
 * `out_splits` and `out_offsets` are n x `experts` int64 in memory the device addresses. Every member checks every
 * member's call before anything is written: an `output` too small for what the peers send fails on every member
 * with HP_SHMEM_INVALID_ARGUMENT naming the rank, the expert and both sizes. `major_align`: dispatch's alignment of
 * each expert's region in rows (0: packed). */
HP_SHMEM_API int hp_shmem_moe_exchange(uint64_t team, int direction, int experts, const void* input,
                                       int64_t input_rows, void* output, int64_t output_rows, size_t row_bytes,
                                       const int64_t* in_splits, const int64_t* in_offsets, int64_t major_align,
                                       int64_t* out_splits, int64_t* out_offsets, int role);
/* MoE across nodes: the two steps every member takes before an exchange moves anything, as the engine's exchange takes
 * them, for the handlers' phases of a team that spans nodes (core/multicore/hierarchy.py). Local, never wait.
 * hp_shmem_moe_row: what this rank publishes of its call (`in_splits`, and `in_offsets` or NULL: members x experts
 * int64 each) into `row`, HP_SHMEM_MOE_ROW_HEADER + 2 x members x experts values.
 * hp_shmem_moe_plan: from every member's published row (`rows`: members x `row_length` values, group-rank order),
 * where member `me`'s chunks land (`splits`, `offsets`: its out_splits and out_offsets) and where each starts on its
 * source (`from`), members x experts each. A member's bad split table or a receiver's output too small fails with
 * HP_SHMEM_INVALID_ARGUMENT and the message every member raises (as hp_shmem_moe_exchange's). */
#define HP_SHMEM_MOE_ROW_HEADER 6
HP_SHMEM_API int hp_shmem_moe_row(int direction, int experts, int members, const int64_t* in_splits,
                                  const int64_t* in_offsets, int64_t input_rows, int64_t output_rows, int64_t* row,
                                  size_t row_capacity);
HP_SHMEM_API int hp_shmem_moe_plan(int direction, int experts, int64_t major_align, int members, const int64_t* rows,
                                   size_t row_length, int me, int64_t* splits, int64_t* offsets, int64_t* from);
/* The MoE row codec (ops/host/codec.h, HostEncodeRows): what a handler sends for dispatch and combine in a
 * low-precision `wire` (an hp_shmem_wire other than HP_SHMEM_WIRE_FULL). Local, on the calling thread, on host memory;
 * no lifecycle needed. A wire row of `row_elems` values takes hp_shmem_wire_row_bytes bytes: float16 and bfloat16
 * the plain cast (round to nearest even), fp8 the row's float32 power-of-two scale then one code per value (torch's
 * rounding). hp_shmem_encode_rows encodes `rows` x `row_elems` values of `dtype` (an hp_shmem_dtype: float32,
 * float64, float16 or bfloat16) at `src` into `dst`; hp_shmem_decode_rows decodes them into `out` of `dtype`. The
 * buffers are contiguous and must not overlap. */
HP_SHMEM_API int hp_shmem_wire_row_bytes(int wire, size_t row_elems, size_t* bytes);
HP_SHMEM_API int hp_shmem_encode_rows(int wire, int dtype, const void* src, size_t rows, size_t row_elems,
                                      void* dst);
HP_SHMEM_API int hp_shmem_decode_rows(int wire, const void* src, size_t rows, size_t row_elems, int dtype,
                                      void* out);
/* Point to point; `type` travels with the message: a receiver of another dtype or size refuses it (its recv fails,
 * and the sender's next send or recv with it). */
HP_SHMEM_API int hp_shmem_send(uint64_t team, const void* data, size_t bytes, const hp_shmem_element_type* type,
                               int peer);
HP_SHMEM_API int hp_shmem_recv(uint64_t team, void* data, size_t bytes, const hp_shmem_element_type* type, int peer);
/* This rank refuses the call `collective` (a Collective value) for a check of its own that failed (`status` a failure
 * code, `message` its text): every member of the team fails the call with it, naming this rank. Returns `status`
 * (or an earlier member's refusal), with hp_shmem_last_error() giving the message every member reports. */
HP_SHMEM_API int hp_shmem_refuse(uint64_t team, int collective, int status, const char* message, int role);
/* A fingerprinted sync of the team on one call, publishing `value_count` int64 values (collective over the team): the
 * handlers' phases across nodes begin each collective with it, so that members of a node whose calls differ all fail
 * (HP_SHMEM_MISMATCH, naming both calls). The call: `collective` (a Collective value), `dtype` ("" for none) of
 * `element_bytes`, `count` elements, `reduce_op` (a ReduceOp value + 1, 0 for none), `wire`, `peer` (a group rank, -1
 * for none), `role`. Every member's values land in `rows` in group-rank order, member i's `row_lengths[i]` of them
 * (`members` entries: the team's size); room for fewer than all of them is refused before the sync. */
HP_SHMEM_API int hp_shmem_agree(uint64_t team, int collective, const char* dtype, size_t element_bytes, uint64_t count,
                                int reduce_op, int wire, int peer, const int64_t* values, size_t value_count,
                                int role, int64_t* rows, size_t rows_capacity, size_t* row_lengths, size_t members);
/* This rank gives up the team's next sync (a failure of its own, e.g. across nodes): members waiting there fail at
 * once with `message`. Local, never waits; returns HP_SHMEM_OK once done. */
HP_SHMEM_API int hp_shmem_give_up(uint64_t team, const char* message);

/* The runtime's snapshot as one JSON object (keys as debug_state's). Writes at most `capacity` bytes including the
 * NUL and sets `*needed` to the full length + 1; call again with a larger buffer when `*needed` > `capacity`. */
HP_SHMEM_API int hp_shmem_debug_state_json(char* buffer, size_t capacity, size_t* needed);

/* The runtime's log records, for a handler that hands them to its framework's logging. While forwarding is on,
 * records are queued (at most 4096: past that the oldest are dropped and a record counts them) instead of written to
 * stderr; a thread of the handler's own takes them, so that its framework is never entered from a thread that holds
 * the runtime's locks. Turning forwarding off writes what is still queued to stderr. Neither call ever fails. */
HP_SHMEM_API void hp_shmem_log_forward(int on);
/* Waits up to `timeout_ms` for a record to be queued, taking none: 1 when one is, 0 on timeout or with forwarding
 * off. */
HP_SHMEM_API int hp_shmem_log_wait(int timeout_ms);
/* Takes the oldest queued record without waiting: returns 1 and fills `*level` (0 debug .. 3 error), `*rank` and
 * `message` (NUL-terminated, cut to `message_bytes` - 1 bytes), or 0 when none is queued. */
HP_SHMEM_API int hp_shmem_log_take(int* level, int* rank, char* message, size_t message_bytes);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* HP_SHMEM_CAPI_HP_SHMEM_H_ */
