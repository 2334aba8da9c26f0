/* Shared-memory layout and process-local state of the engine.
 *
 * Every flag that one process writes and another polls is a monotonic 64-bit
 * sequence number alone on its own cache-line pair (128 B, so the adjacent-line
 * prefetcher does not couple two flags).  Data is written before a release store of
 * the flag; the reader does an acquire load before touching the data. */
#ifndef SC_INTERNAL_H
#define SC_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>
#include <stddef.h>
#include "shmcoll.h"

#define SC_MAGIC 0x6c6c6f636d687353ULL   /* "Sshmcoll" little-endian */
#define SC_LAYOUT_VERSION 13u
#define SC_TABLES 2          /* channel tables: collectives, point-to-point */
#define SC_LINE 128
#define SC_PAGE 4096
#define SC_MAX_WORLD 1024

/* A polled flag.  `waiters` counts processes asleep on the futex of `value`, so a
 * writer pays for FUTEX_WAKE only when somebody actually sleeps.  Every flag in the
 * segment is declared SC_ALONE: it starts its own cache-line pair. */
typedef struct sc_flag {
    _Atomic uint64_t value;
    _Atomic uint32_t waiters;
} sc_flag;
#define SC_ALONE _Alignas(SC_LINE)

enum sc_rank_state { SC_RANK_EMPTY = 0, SC_RANK_ATTACHED = 1, SC_RANK_CLOSED = 2, SC_RANK_FAILED = 3 };

/* Why the job was aborted (the value of the header's abort flag). */
enum sc_abort_reason { SC_ABORT_NONE = 0, SC_ABORT_FAILED = 1, SC_ABORT_MISMATCH = 2,
                       SC_ABORT_REFUSED = 3 };

/* What a rank is about to do.  Every rank publishes its call before moving data and
 * checks a peer's call before consuming anything the peer sent, so ranks that
 * disagree stop before a single wrong byte is used. */
typedef struct sc_call {
    int64_t field[SC_CALL_FIELDS];   /* enum sc_call_field order */
    /* Not compared.  where: where this rank's x and out lie in its own address space,
     * read by peers with cross-memory attach (the cma schedules; 0 in other calls);
     * payload: this rank's part of an inline call (sc_inline.c), read by every peer
     * with the record.  (Sized so that the record and its flag fill a line pair.) */
    union {
        uint64_t where[2];
        unsigned char payload[SC_INLINE_BYTES];
    };
} sc_call;
enum { SC_WHERE_X = 0, SC_WHERE_OUT = 1 };

/* Published calls: ring of SC_CALL_HISTORY entries by sequence number, so a peer
 * that is already in a later call does not overwrite the one we are checking.  No
 * rank returns from call n before every peer has published call n, so a peer is at
 * most one call ahead of any rank still in call n: two entries would do. */
#define SC_CALL_HISTORY 4
typedef struct sc_call_slot {
    SC_ALONE sc_flag seq;
    sc_call call;            /* same cache line as seq: one miss reads both */
} sc_call_slot;

/* The first mismatch found, for every rank's error message. */
typedef struct sc_mismatch {
    _Alignas(SC_LINE) _Atomic uint32_t claimed;
    int32_t field, rank_a, rank_b;
    int64_t value_a, value_b, collective;
} sc_mismatch;

/* The refusal at join that aborted the job (SC_ABORT_REFUSED). */
typedef struct sc_refusal {
    _Alignas(SC_LINE) _Atomic uint32_t claimed;
    int32_t rank, reason;
    int64_t expected, got;
} sc_refusal;

typedef struct sc_header {
    uint64_t magic;
    uint32_t version;
    uint32_t world;
    uint64_t size;
    uint64_t token;
    uint64_t slot_bytes;
    uint32_t nslots;
    int32_t creator_pid;
    SC_ALONE sc_flag attached;   /* number of ranks attached so far */
    SC_ALONE sc_flag abort;      /* enum sc_abort_reason: non-zero makes every wait bail out */
    int32_t failed_rank;         /* SC_ABORT_FAILED: the rank that failed, or -1 */
    sc_mismatch mismatch;
    sc_refusal refusal;
} sc_header;

typedef struct sc_rank_block {
    SC_ALONE sc_flag barrier;        /* single-copy calls this rank is done with */
    sc_call_slot calls[SC_CALL_HISTORY];
    _Alignas(SC_LINE) _Atomic int32_t pid;
    _Atomic int32_t state;           /* enum sc_rank_state */
    /* The call this rank gave up on half-way (0: none; there is only one, for its
     * communicator is broken then): peers that finish that call fail it too, rather
     * than succeed where this rank reported a failure. */
    _Atomic uint64_t abandoned;
    /* Cross-memory attach (sc_cma.c): where this rank's probe word and its mapping
     * of the segment lie in its process (set before it counts itself attached), and,
     * rank 0 only, the costs it measured (published before its verdict). */
    uint64_t cma_probe, cma_base;
    uint64_t cma_src, cma_copy_ps;          /* rank 1: its half of rank 0's measurement */
    uint64_t cma_call_ps, cma_ratio_ppm, cma_warm_ppm, cma_write_ppm;
    SC_ALONE sc_flag cma;            /* enum sc_cma_verdict, once this rank probed */
} sc_rank_block;

enum sc_cma_verdict { SC_CMA_UNKNOWN = 0, SC_CMA_PERMITTED = 1, SC_CMA_DENIED = 2 };

/* One single-producer/single-consumer channel src -> dst: `head` counts slots
 * written by src, `tail` counts slots consumed by dst. */
typedef struct sc_channel {
    SC_ALONE sc_flag head;
    SC_ALONE sc_flag tail;
} sc_channel;

/* Process-local end of a channel: our own counter and the last value we saw of
 * the other side's, so the common case reads no remote cache line. */
typedef struct sc_endpoint {
    sc_channel *ch;
    char *slots;
    uint64_t seq;
    uint64_t seen;
    uint64_t checked;    /* the call of ours the peer's call was last checked against */
    int peer;
    int reserved;        /* send side: the channel's slot pages are backed by memory */
    const void *owner;   /* point-to-point: the operation whose message is mid-channel */
} sc_endpoint;

/* A point-to-point message received ahead of the receive that matches it. */
typedef struct sc_stashed {
    struct sc_stashed *next;
    int64_t tag, dtype;
    uint64_t bytes;
    char data[];
} sc_stashed;

/* What a failure is blamed on. */
typedef struct sc_blame {
    int peer;            /* the rank the failure is blamed on */
    int waited;          /* the rank this one was waiting for (-1: none) */
    const char *what;    /* the wait, a phrase taking `waited` as its object */
} sc_blame;

/* Set while this thread runs point-to-point operations (sc_p2p_run): the failures
 * it meets are theirs. */
extern _Thread_local int sc_in_p2p;
#define SC_BLAME(c) (&(c)->blame[sc_in_p2p])

struct sc_comm {
    char *base;
    size_t size;
    sc_header *hdr;
    sc_rank_block *ranks;
    int rank, world;
    uint64_t slot_bytes;
    uint32_t nslots;
    sc_params params;
    sc_endpoint *send;   /* indexed by destination rank */
    sc_endpoint *recv;   /* indexed by source rank */
    sc_endpoint *p2p_send, *p2p_recv;   /* point-to-point's own channels */
    sc_stashed **stash;  /* per source: messages received ahead of their receive */
    uint64_t barrier_seq; /* single-copy calls done (ranks[rank].barrier) */
    uint64_t call_seq;   /* calls published so far */
    sc_call call;        /* the current one */
    char *scratch;       /* 2 x slot_bytes of process-local accumulator space */
    char *wide;          /* whole-vector accumulator for narrow dtypes (grown on demand) */
    size_t wide_bytes;
    int fd;              /* the segment's file, to reserve channel memory at first use */
    /* A failed collective breaks the communicator (both kinds of call refuse to run);
     * a failed send or receive only its messages' channels (p2p_broken). */
    _Atomic int broken;
    _Atomic int p2p_broken;
    _Atomic int closing; /* set by another thread's close(): waits give up */
    /* The last failure of the collectives [0] and of the point-to-point operations
     * [1]: the two may run at once, on two threads (sc_progress.c). */
    sc_blame blame[2];
    /* Cross-memory attach: agreed by every rank (sc_cma_agree); the word peers read
     * to prove they reach this process; the peers' published x and out addresses of
     * the current call (2 per rank); two chunks of staging for reduced reads. */
    int cma;
    uint64_t cma_word;
    uint64_t *peer_where;
    char *stage;
    /* Fan-out (sc_put_all): chunks this rank wrote into its own channel to itself for
     * every peer at once, and, per peer, how many of that peer's it has read. */
    uint64_t fan_sent;
    uint64_t *fan_read;
    /* Inline calls: every rank's part of the current call, SC_INLINE_BYTES each, copied
     * out of the records as they are checked (own part included). */
    unsigned char *parts;
    /* Eager calls: every rank's two part buffers (sc_eager_part). */
    char *eager;
    /* sc_hold: the caller's lock, released before a wait lasts past hold_ns. */
    void (*release)(void *);
    void *release_arg;
    uint64_t hold_ns;
};

/* Layout arithmetic shared by the creator and every attacher. */
size_t sc_off_ranks(void);
size_t sc_off_channels(int world);
size_t sc_off_eager(int world);
size_t sc_off_slots(int world);

/* Rank q's part buffer for call `seq` of an eager call (sc_inline.c): two per rank,
 * by the call's parity.  A rank writes one in call n+2 at the earliest after a peer
 * read it in call n: a rank in call n+2 has checked that every peer published call
 * n+1, which a peer does only once it returned from call n. */
static inline char *sc_eager_part(const sc_comm *c, int q, uint64_t seq)
{
    return c->eager + ((size_t)q * 2 + (seq & 1)) * SC_EAGER_BYTES;
}

/* Abort the job because `failed_rank` (-1: unknown) failed, unless a reason is set. */
void sc_abort_failed(sc_header *h, int failed_rank);

/* Waiting (sc_wait.c). */
int sc_wait_ge(sc_comm *c, sc_flag *f, uint64_t target, int peer, const char *what, uint64_t *seen);
void sc_signal(sc_flag *f, uint64_t value);
/* Wake the waiters of a flag already changed (by an atomic read-modify-write: a flag
 * several writers count up must not be stored, or a late store undoes an increment). */
void sc_wake(sc_flag *f);
uint64_t sc_now_ns(void);
/* A wait on a flag of this process (no peer to check): spin, yield, then sleep in
 * slices until it reaches target, the timeout expires (SC_ETIMEDOUT) or
 * interrupted() (may be NULL) says to stop (SC_EINTR). */
int sc_wait_local(sc_flag *f, uint64_t target, uint64_t spin_ns, uint64_t yield_ns,
                  double timeout_s, int (*interrupted)(void));
/* True on a communicator's progress thread (sc_progress.c), whose waits for peers
 * poll as its queue says instead of as the communicator's parameters say. */
extern _Thread_local int sc_on_progress_thread;
extern _Thread_local uint64_t sc_progress_spin_ns, sc_progress_yield_ns;

/* A schedule: one (collective, algorithm) pair, called by sc_run after the call is
 * published; k is NULL for copy-only collectives. */
struct sc_kernels;
typedef int (*sc_schedule)(sc_comm *c, const sc_args *a, const struct sc_kernels *k);

int sc_ring_allreduce(sc_comm *c, const sc_args *a, const struct sc_kernels *k);
int sc_ring_reduce_scatter(sc_comm *c, const sc_args *a, const struct sc_kernels *k);
int sc_ring_allgather(sc_comm *c, const sc_args *a, const struct sc_kernels *k);
int sc_direct_allreduce(sc_comm *c, const sc_args *a, const struct sc_kernels *k);
int sc_direct_two_shot(sc_comm *c, const sc_args *a, const struct sc_kernels *k);
int sc_direct_reduce_scatter(sc_comm *c, const sc_args *a, const struct sc_kernels *k);
int sc_direct_allgather(sc_comm *c, const sc_args *a, const struct sc_kernels *k);
/* Rooted schedules (sc_rooted.c) over a tree whose shape follows a->algo: binomial
 * (tree), chain (ring), star (direct, naive); AllReduce as Reduce + Broadcast. */
int sc_rooted_broadcast(sc_comm *c, const sc_args *a, const struct sc_kernels *k);
int sc_rooted_reduce(sc_comm *c, const sc_args *a, const struct sc_kernels *k);
int sc_rooted_gather(sc_comm *c, const sc_args *a, const struct sc_kernels *k);
int sc_rooted_scatter(sc_comm *c, const sc_args *a, const struct sc_kernels *k);
int sc_rooted_allreduce(sc_comm *c, const sc_args *a, const struct sc_kernels *k);
int sc_rhd_allreduce(sc_comm *c, const sc_args *a, const struct sc_kernels *k);
int sc_rhd_reduce_scatter(sc_comm *c, const sc_args *a, const struct sc_kernels *k);
int sc_rhd_allgather(sc_comm *c, const sc_args *a, const struct sc_kernels *k);
/* All-to-all (sc_alltoall.c). */
int sc_direct_alltoall(sc_comm *c, const sc_args *a, const struct sc_kernels *k);
int sc_direct_alltoallv(sc_comm *c, const sc_args *a, const struct sc_kernels *k);
int sc_bruck_alltoall(sc_comm *c, const sc_args *a, const struct sc_kernels *k);
/* Single-copy schedules (sc_single_copy.c): peers' buffers read where they lie, in
 * symmetric buffers (SC_ALGO_SYMMETRIC*) or with cross-memory attach (SC_ALGO_CMA*). */
int sc_single_copy_allreduce(sc_comm *c, const sc_args *a, const struct sc_kernels *k);
int sc_single_copy_two_shot(sc_comm *c, const sc_args *a, const struct sc_kernels *k);
int sc_single_copy_reduce_scatter(sc_comm *c, const sc_args *a, const struct sc_kernels *k);
int sc_single_copy_allgather(sc_comm *c, const sc_args *a, const struct sc_kernels *k);
int sc_single_copy_broadcast(sc_comm *c, const sc_args *a, const struct sc_kernels *k);
int sc_single_copy_reduce(sc_comm *c, const sc_args *a, const struct sc_kernels *k);
int sc_single_copy_gather(sc_comm *c, const sc_args *a, const struct sc_kernels *k);
/* Inline and eager schedules (sc_inline.c): every rank's part in its call record, or
 * in its part buffer (sc_eager_part), published with the record. */
int sc_inline_allreduce(sc_comm *c, const sc_args *a, const struct sc_kernels *k);
int sc_inline_reduce_scatter(sc_comm *c, const sc_args *a, const struct sc_kernels *k);
int sc_inline_allgather(sc_comm *c, const sc_args *a, const struct sc_kernels *k);
int sc_inline_broadcast(sc_comm *c, const sc_args *a, const struct sc_kernels *k);
int sc_inline_reduce(sc_comm *c, const sc_args *a, const struct sc_kernels *k);
int sc_inline_gather(sc_comm *c, const sc_args *a, const struct sc_kernels *k);
int sc_inline_scatter(sc_comm *c, const sc_args *a, const struct sc_kernels *k);
int sc_inline_alltoall(sc_comm *c, const sc_args *a, const struct sc_kernels *k);
/* The bytes of x a rank publishes in an inline or eager call (more than
 * SC_INLINE_BYTES: the call cannot run inline; more than SC_EAGER_BYTES: nor eager). */
size_t sc_inline_part_bytes(const sc_args *a, const struct sc_kernels *k, int world);
/* Whether `rank` has a part in the call (Broadcast, Scatter: the root alone). */
int sc_eager_publishes(const sc_args *a, int rank);

/* Cross-memory attach (sc_cma.c): bytes of rank q's process at `remote` into dst;
 * a failure aborts the job (the peer is gone or unreachable) and names q. */
int sc_cma_read(sc_comm *c, int q, uint64_t remote, void *dst, size_t bytes);
/* The other way: src into rank q's process at `remote` (same failure rule). */
int sc_cma_write(sc_comm *c, int q, uint64_t remote, const void *src, size_t bytes);
/* Sets this rank's probe word and publishes where it lies (at attach, before the
 * rank counts itself in). */
void sc_cma_publish(sc_comm *c);
static inline int sc_is_cma(int algo) { return algo == SC_ALGO_CMA || algo == SC_ALGO_CMA_TWO_SHOT; }

/* Block b of `count` elements cut in `world` parts: [off, off+len), the first
 * count % world blocks one element longer. */
static inline void sc_block_range(size_t count, int world, int b, size_t *off, size_t *len)
{
    size_t base = count / (size_t)world, rem = count % (size_t)world;
    *off = (size_t)b * base + ((size_t)b < rem ? (size_t)b : rem);
    *len = base + ((size_t)b < rem);
}

/* Chunk i (of `chunk` elements) of block b; false when the block is shorter. */
static inline int sc_chunk_of(size_t count, int world, int b, size_t i, size_t chunk,
                              size_t *off, size_t *n)
{
    size_t boff, blen;
    sc_block_range(count, world, b, &boff, &blen);
    if (i * chunk >= blen)
        return 0;
    *off = boff + i * chunk;
    *n = blen - i * chunk < chunk ? blen - i * chunk : chunk;
    return 1;
}

static inline size_t sc_div_up(size_t a, size_t b) { return (a + b - 1) / b; }

static inline size_t sc_min(size_t a, size_t b) { return a < b ? a : b; }

static inline size_t sc_max(size_t a, size_t b) { return a > b ? a : b; }

/* The one error-propagation idiom: a step that fails ends the schedule with its
 * status (the communicator is marked broken by sc_run). */
#define SC_TRY(expr)                    \
    do {                                \
        int sc_try_status_ = (expr);    \
        if (sc_try_status_ != SC_OK)    \
            return sc_try_status_;      \
    } while (0)

static inline int sc_wrap(int r, int world) { return ((r % world) + world) % world; }

/* Outputs this large are written with streaming stores. */
static inline int sc_use_stream(const sc_comm *c, size_t out_bytes)
{
    return c->params.stream_bytes && out_bytes >= c->params.stream_bytes;
}

/* A process-local accumulator of at least `bytes` (NULL when out of memory). */
void *sc_wide(sc_comm *c, size_t bytes);

/* Point-to-point (sc_p2p.c): sc_p2p with a hook the group calls when all of its ops
 * are stuck, before it waits: more() may append ops to ops[n..cap) and returns the
 * new count (the progress thread adds the p2p works queued meanwhile).  When it adds
 * none it names a flag (*wake, may be NULL) whose reaching *target means there may be
 * more: the group's wait ends then too, so an op queued while it waits joins at once. */
typedef int (*sc_p2p_more)(void *ctx, sc_p2p_op **ops, int n, int cap, sc_flag **wake,
                           uint64_t *target);
/* Called (when not NULL) after ops of the group finished while others are still
 * pending: the finished ones are gone from ops[] then (their works may complete at
 * once), and the group goes on with the rest, in their order. */
typedef void (*sc_p2p_finished)(void *ctx);
int sc_p2p_run(sc_comm *c, sc_p2p_op **ops, int n, int cap, sc_p2p_more more,
               sc_p2p_finished finished, void *ctx);
/* Backs the slots of our channel e with memory (once, before its first touch). */
int sc_reserve_channel(sc_comm *c, sc_endpoint *e);
/* Frees the messages received ahead of a receive (at detach). */
void sc_p2p_free_stash(sc_comm *c);
/* Waits until flags[i] reaches targets[i] for some i (sc_wait.c). */
int sc_wait_any(sc_comm *c, sc_flag *const *flags, const uint64_t *targets, const int *peers,
                int n, const char *what, int *waited);

/* Calls (sc_call.c): publish ours, check a peer's before using its data, and check
 * every peer not checked yet before returning, so that every rank learns of every
 * mismatch, calls that move no data included. */
void sc_call_begin(sc_comm *c, int collective, int64_t count, int dtype, int op, int root, int algo,
                   int64_t sym_x, int64_t sym_out, const void *x, const void *out,
                   const void *payload, size_t payload_bytes);
int sc_call_check(sc_comm *c, int peer);
/* sc_call_check unless this call was checked against peer's already (recv[peer].checked). */
int sc_call_check_once(sc_comm *c, int peer);
int sc_call_check_all(sc_comm *c);
/* A rank that gives up on its current call says so; a rank that finished a call
 * fails it when some peer gave that call up. */
void sc_call_abandon(sc_comm *c);
int sc_call_check_abandoned(sc_comm *c);
void sc_wake_peers(sc_comm *c);     /* (sc_comm.c) */

/* Channel operations (sc_comm.c): a slot of the channel to / from a peer. */
int sc_send_acquire(sc_comm *c, sc_endpoint *e, void **slot);
/* Waits until the channel has a free slot, without touching its slots (fan-out). */
int sc_send_credit(sc_comm *c, sc_endpoint *e);
void sc_send_commit(sc_endpoint *e);
int sc_recv_acquire(sc_comm *c, sc_endpoint *e, const void **slot);
void sc_recv_release(sc_endpoint *e);

/* Primitives (sc_prims.c), what schedules are written in, as NCCL's prims: */
/* one chunk (bytes <= slot_bytes) copied into / out of a channel; */
int sc_put(sc_comm *c, int peer, const void *src, size_t bytes);
int sc_get(sc_comm *c, int peer, void *dst, size_t bytes, int stream);
/* one chunk for every peer at once (fan-out): written once, read by each peer from
 * where it lies; the receiving side takes it with sc_recv_acquire_all (or sc_get_all)
 * and gives it back with sc_recv_release_all.  Where world > 2 the chunk lies in the
 * sender's channel to itself, which nothing else uses, and the channel to each peer
 * carries only its flags; its credits are what frees the chunk's slot for reuse. */
int sc_put_all(sc_comm *c, const void *src, size_t bytes);
int sc_recv_acquire_all(sc_comm *c, int peer, const void **slot);
void sc_recv_release_all(sc_comm *c, int peer);
int sc_get_all(sc_comm *c, int peer, void *dst, size_t bytes, int stream);
/* a byte range of any length, slot by slot (the receiver gets it in the same cuts); */
int sc_put_range(sc_comm *c, int peer, const void *src, size_t bytes);
int sc_get_range(sc_comm *c, int peer, void *dst, size_t bytes, int stream);
/* a chunk received from `from`, combined with n elements of x straight into the slot
 * sent to `to` (the partial in the accumulator type): a ring step without a copy. */
int sc_recv_reduce_send(sc_comm *c, int from, int to, const struct sc_kernels *k,
                        const void *x, size_t n);

#endif
