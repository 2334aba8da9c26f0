/* shmcoll C engine: the public interface the Cython layer calls.
 *
 * Python decides (arguments, algorithm, lifecycle of the segment); this code moves
 * and reduces bytes between ranks that share one mapped segment.  Every function
 * that can wait returns a status; the Cython layer turns it into an exception. */
#ifndef SHMCOLL_H
#define SHMCOLL_H

#include <stddef.h>
#include <stdint.h>

typedef enum sc_status {
    SC_OK = 0,
    SC_ETIMEDOUT = 1,   /* a peer did not arrive within the timeout */
    SC_EPEERLOST = 2,   /* the peer waited for died or closed its communicator */
    SC_EABORTED = 3,    /* another rank marked the job as failed */
    SC_EINVAL = 4,      /* unsupported dtype/op pair or bad sizes */
    SC_ELAYOUT = 5,     /* the segment is not a shmcoll segment of this version/job */
    SC_ERANKTAKEN = 6,  /* another live process already holds this rank */
    SC_EBROKEN = 7,     /* an earlier collective failed half-way; the stream is unusable */
    SC_EINTR = 8,       /* params.interrupted() asked to stop (a signal handler raised) */
    SC_EMISMATCH = 9,   /* ranks called different collectives or arguments */
    SC_ECLOSED = 10,    /* another thread closed the communicator during the call */
    SC_ENOMEM = 11,     /* process memory could not be allocated */
    SC_ENOSPACE = 12,   /* /dev/shm is too full to back a channel of the segment */
    SC_EREFUSED = 13,   /* a rank was refused at join; the job cannot form */
    SC_ETRUNCATE = 14,  /* a message's size or type differs from its receive's (the
                         * message was discarded; the communicator stays usable) */
} sc_status;

/* Why a rank was refused at join (sc_refuse); every rank of the job reports it. */
typedef enum sc_refusal_reason {
    SC_REFUSE_WORLD = 1,      /* it passed another world size than the job's */
    SC_REFUSE_RANK_TAKEN = 2, /* another live process already holds its rank */
    SC_REFUSE_COLLISION = 3,  /* a second job is forming under the same name */
    SC_REFUSE_NO_SPACE = 4,   /* /dev/shm could not back its channel */
} sc_refusal_reason;

/* Order matters: the Cython layer maps numpy dtypes onto these codes. */
typedef enum sc_dtype {
    SC_INT8, SC_UINT8, SC_INT16, SC_UINT16, SC_INT32, SC_UINT32, SC_INT64, SC_UINT64,
    SC_FLOAT16, SC_BFLOAT16, SC_FLOAT32, SC_FLOAT64, SC_NDTYPES
} sc_dtype;

/* The fields of a call that every rank must agree on, in the order they are compared.
 * SC_FIELD_SEQUENCE is no field of the record: a mismatch in it means a peer's record
 * of this call was already overwritten by a later call (it cannot happen while every
 * rank checks every peer before it returns; it is reported, never skipped). */
typedef enum sc_call_field {
    SC_FIELD_COLLECTIVE, SC_FIELD_COUNT, SC_FIELD_DTYPE, SC_FIELD_OP, SC_FIELD_ROOT,
    SC_FIELD_ALGORITHM, SC_FIELD_SYMMETRIC_X, SC_FIELD_SYMMETRIC_OUT, SC_CALL_FIELDS,
    SC_FIELD_SEQUENCE = SC_CALL_FIELDS
} sc_call_field;

typedef enum sc_collective {
    SC_COLL_BARRIER = 1, SC_COLL_ALLREDUCE, SC_COLL_REDUCE_SCATTER, SC_COLL_ALLGATHER,
    SC_COLL_BROADCAST, SC_COLL_REDUCE, SC_COLL_GATHER, SC_COLL_SCATTER, SC_COLL_ALLTOALL,
    SC_COLL_ALLTOALLV, SC_NCOLLECTIVES
} sc_collective;

/* Schedules.  The Python layer names them (ring, direct, tree, rhd, naive) and picks
 * the variant; every rank must pass the same code. */
typedef enum sc_algo {
    SC_ALGO_RING = 0,          /* ring RS/AG/AllReduce; chain Broadcast/Reduce */
    SC_ALGO_DIRECT = 1,        /* star rooted ops; one-shot AllReduce; direct RS/AG */
    SC_ALGO_DIRECT_TWO_SHOT = 2, /* AllReduce = direct ReduceScatter + direct AllGather */
    SC_ALGO_TREE = 3,          /* binomial trees; AllReduce = Reduce + Broadcast, pipelined */
    SC_ALGO_RHD_DOUBLING = 4,  /* recursive-doubling AllReduce and AllGather */
    SC_ALGO_RHD_HALVING = 5,   /* Rabenseifner: recursive halving RS + doubling AG */
    SC_ALGO_NAIVE = 6,         /* AllReduce = star Reduce to rank 0 + star Broadcast */
    SC_ALGO_BRUCK = 7,         /* Bruck's log-step all-to-all */
    SC_ALGO_SYMMETRIC = 8,     /* single copy: peers' symmetric buffers read in place */
    SC_ALGO_SYMMETRIC_TWO_SHOT = 9, /* AllReduce: block q reduced by rank q into its symmetric
                                     * out, then every rank copies the blocks */
    SC_ALGO_CMA = 10,          /* single copy of ordinary arrays: peers' buffers read with
                                * cross-memory attach (process_vm_readv) */
    SC_ALGO_CMA_TWO_SHOT = 11, /* AllReduce: block q reduced by rank q, then read from it */
    SC_ALGO_DIRECT_INLINE = 12, /* every rank's part carried in its call record (tiny calls) */
    SC_ALGO_DIRECT_EAGER = 13, /* every rank's part written beside its call record (small calls) */
    SC_NALGOS
} sc_algo;

/* The most bytes of x a rank may pass to a SC_ALGO_DIRECT_INLINE call (the whole x of
 * ReduceScatter; AllGather's row). */
#define SC_INLINE_BYTES 48
/* The most bytes of x a rank may pass to a SC_ALGO_DIRECT_EAGER call (same parts).  Past
 * 16 KiB, on a 2-core EPYC, eager took 0.9-1.1x one-shot's time and 1.13x two-shot's
 * (P = 4, 32 KiB AllReduce): the saved synchronisation no longer shows. */
#define SC_EAGER_BYTES (16 << 10)

typedef enum sc_op {
    SC_SUM, SC_PROD, SC_MIN, SC_MAX, SC_AVG, SC_BAND, SC_BOR, SC_BXOR, SC_NOPS
} sc_op;

typedef struct sc_params {
    double timeout_s;     /* every wait gives up after this long */
    uint64_t spin_ns;     /* busy-poll this long before yielding the core */
    uint64_t yield_ns;    /* then sched_yield() this long before sleeping on a futex */
    uint64_t slot_bytes;  /* bytes per ring-buffer slot (the pipelining chunk) */
    uint32_t nslots;      /* slots per channel; >= 2 keeps the ring deadlock-free */
    uint64_t stream_bytes; /* outputs this large are written with streaming stores (0: never) */
    int (*interrupted)(void); /* polled while asleep; non-zero abandons the wait (may be NULL) */
} sc_params;

typedef struct sc_comm sc_comm;

/* Segment lifecycle.  The creator sizes and formats; every rank maps and attaches. */
size_t sc_segment_size(int world, const sc_params *p);
/* Bytes of the segment every job touches whatever it runs: header, rank blocks,
 * channel flags and eager calls' part buffers (the creator reserves them before
 * formatting). */
size_t sc_control_bytes(int world);
/* Bytes of one channel's slots (slot_bytes x nslots, whole pages). */
size_t sc_channel_bytes(uint64_t slot_bytes, uint32_t nslots);
/* Backs [off, off + len) of the segment's file with memory now, so that a full
 * /dev/shm is an error here instead of SIGBUS at first touch.  0 or an errno. */
int sc_reserve(int fd, size_t off, size_t len);
void *sc_map(int fd, size_t size, int *err);
void sc_unmap(void *base, size_t size);
int sc_format(void *base, size_t size, int world, const sc_params *p, uint64_t token, int creator_pid);
int sc_segment_world(const void *base, size_t size);   /* -1 when not a shmcoll segment */
int sc_segment_creator(const void *base, size_t size);
/* The creator's pid then each rank's (0 before it attached); -1 if not a valid segment. */
int sc_segment_pids(const void *base, size_t size, int32_t *pids, int max);

/* Attach: validates the header, claims the rank, counts arrivals.
 * *last is set when this rank completed the set (it may unlink the name). */
sc_comm *sc_attach(void *base, size_t size, int fd, int rank, int world, uint64_t token,
                   const sc_params *wait, int *status, int *last);
int sc_wait_attached(sc_comm *c);
void sc_detach(sc_comm *c, int failed);   /* frees c; does not unmap */
/* Makes every rank's waits fail fast; they name `failed_rank` (-1: unknown) as lost. */
void sc_segment_abort(void *base, size_t size, int failed_rank);
/* Refuses `rank` at join for `reason` (expected / got say what differed): aborts the
 * job so that every rank, attached or still arriving, fails at once naming it. */
void sc_segment_refuse(void *base, size_t size, int rank, int reason, int64_t expected, int64_t got);
/* The refusal that aborted the job: {rank, reason, expected, got}; reason 0 if none. */
void sc_segment_refusal(const void *base, size_t size, int64_t out[4]);
/* From another thread: make the call running on c give up (SC_ECLOSED) at its next
 * wait.  The caller must not detach c until that call has returned. */
void sc_request_close(sc_comm *c);

/* One collective call.  Buffers are C-contiguous; `count` is, per collective:
 *   allreduce, reduce          elements of x (= of out)
 *   reduce_scatter             elements of out (x holds world x count)
 *   allgather, gather          bytes of x (out holds world x count bytes)
 *   scatter                    bytes of out (x, on the root, holds world x count)
 *   broadcast                  bytes of x (in place: out is unused)
 *   alltoall                   bytes of one block (x and out hold world x count)
 *   alltoallv                  bytes of one row; `layout` holds the byte offsets and
 *                              lengths (send offsets, send lengths, receive offsets,
 *                              receive lengths: world of each), agreed by the ranks
 * Copy-only collectives take dtype = -1.  x of a non-root scatter and out of a
 * non-root reduce/gather are unused (may be NULL); root is -1 when not rooted. */
typedef struct sc_args {
    int collective, algo, dtype, op, root;
    const void *x;
    void *out;
    size_t count;
    const uint64_t *layout;     /* alltoallv only */
    /* Symmetric schedules only: rank q's copy of x is at sym_x + q * sym_x_stride in
     * this process (x itself is rank `rank`'s), likewise out at sym_out (NULL when out
     * is not in a symmetric buffer).  The ids say where in which buffer x and out lie
     * (-1: not symmetric); every rank must pass the same (they are call fields). */
    const char *sym_x;
    char *sym_out;
    size_t sym_x_stride, sym_out_stride;
    int64_t sym_x_id, sym_out_id;
} sc_args;

/* Cross-memory attach (sc_cma.c).  Called by every rank once all attached: each
 * reads a word of every peer's process with process_vm_readv (ptrace's permission:
 * Yama's ptrace_scope, containers, seccomp and non-dumpable processes can forbid it),
 * publishes its verdict (`allowed` 0: this rank declines) and waits for the others'.
 * *agreed: every rank may read every other's memory.  costs (set when agreed), as
 * rank 0 measured them, the same on every rank: {seconds of a small read, time of a
 * read of bytes a peer has just written / time of the same bytes' two copies through
 * a channel, the same for bytes the reader read before and the peer left unchanged,
 * the same for a write of bytes in the writer's cache into the peer's memory}. */
int sc_cma_agree(sc_comm *c, int allowed, int *agreed, double costs[4]);

int sc_barrier(sc_comm *c);
int sc_run(sc_comm *c, const sc_args *a);
/* The caller's lock (Python's GIL) kept through the first hold_ns of waiting of the
 * calls that follow: a wait still unmet then calls release(arg) first, once, on the
 * calling thread; sc_hold(c, 0, NULL, NULL) ends it.  Taking and dropping the GIL
 * costs about a tenth of a small exchange, and most small calls finish before
 * it would matter; a wait that lasts lets other threads run. */
void sc_hold(sc_comm *c, uint64_t hold_ns, void (*release)(void *), void *arg);
/* Whether sc_run implements (collective, algo). */
int sc_implements(int collective, int algo);

/* Point-to-point (sc_p2p.c).  Messages travel on channels of their own, one per
 * ordered pair, in order; a receive takes the first message from its source whose
 * tag matches (SC_ANY_TAG: any), and a message that arrives ahead of its receive
 * (another tag) is kept in process memory until one matches it.  A send returns once
 * the whole message is in the channel (at once when it fits the free slots); a
 * message must then be received before the sender's next one to that rank can
 * follow it.  sc_p2p runs a group of operations together, each advancing as its
 * peer allows, so that exchanges (sendrecv, a batch of isend/irecv) cannot deadlock
 * on each other. */
#define SC_ANY_TAG (-1)
enum { SC_P2P_SEND = 1, SC_P2P_RECV = 2 };
/* A message's header's room in its first slot (keeps the data aligned): a channel of
 * n slots holds a message of n x slot_bytes - SC_P2P_FRAME_BYTES bytes whole. */
#define SC_P2P_FRAME_BYTES 64

typedef struct sc_p2p_op {
    int kind;                /* SC_P2P_SEND or SC_P2P_RECV */
    int peer;
    int64_t tag;             /* >= 0; a receive may pass SC_ANY_TAG */
    int64_t dtype;           /* a type code both sides must agree on */
    void *buf;               /* send: read; receive: written */
    uint64_t bytes;          /* a receive's message must be exactly this long */
    /* outcome: SC_OK, SC_ETRUNCATE (-1: cut off by the group's failure); for a
     * receive, the tag, length and type of the message it matched */
    int status;
    int64_t got_tag, got_dtype;
    uint64_t got_bytes;
    /* the engine's progress through it */
    uint64_t done;
    int state;
    void *stashing;
} sc_p2p_op;

/* Runs ops[0..n) to completion: SC_OK when every one ended SC_OK or SC_ETRUNCATE
 * (each op's status says which), else the failure that stopped them (later sends
 * and receives are then refused: a message is mid-channel; collectives go on). */
int sc_p2p(sc_comm *c, sc_p2p_op *const *ops, int n);
/* The largest message a send to this rank itself fits in the free slots of its
 * channel now (-1: not even an empty one), for a caller that knows nothing else
 * receives from that channel while it waits. */
int64_t sc_p2p_self_room(const sc_comm *c);

/* Nonblocking calls (sc_progress.c).  A progress thread runs the works submitted to
 * its queue one by one in submission order, exactly as sc_run / sc_barrier / sc_p2p
 * would in the caller.  Collectives and point-to-point works may go on two queues of
 * one communicator, and a blocking call of one kind may run beside the other kind's
 * queue.  The caller keeps each work (and its buffers) alive until
 * sc_progress_completed() reaches its ticket.  The thread never takes the GIL and
 * runs no signal handlers.  After a work fails, the later ones of its queue are not
 * run: they complete with the same status (and `skipped` set), as a blocking call
 * on a broken communicator would refuse to run. */
#define SC_WORK_P2P 0x7000      /* a work's collective field: point-to-point ops */
typedef struct sc_work {
    sc_args args;             /* collective SC_COLL_BARRIER: a barrier; SC_WORK_P2P:
                               * nops point-to-point ops, run together with the p2p
                               * works queued right after it */
    sc_p2p_op *ops;
    int nops;
    struct sc_work *next;     /* the queue's link */
    uint64_t ticket;          /* the work's place in submission order, from 1 */
    int status;               /* SC_OK or why it failed */
    int skipped;              /* not run: an earlier work failed with `status` */
    int err_peer, err_waited; /* as sc_error_peer / sc_error_waited after the failure */
    const char *err_what;
    _Atomic int finished;     /* a p2p work completed ahead of its ticket (see below) */
} sc_work;

typedef struct sc_progress sc_progress;

/* Starts c's progress thread; NULL and *err = an errno when it cannot.  The thread
 * and the callers waiting for its works busy-poll spin_ns at most (0 unless every
 * rank's caller and progress thread can have a core of their own: a polling thread
 * would hold the core another one needs). */
sc_progress *sc_progress_start(sc_comm *c, uint64_t spin_ns, int *err);
/* Queues w (its args filled in); returns its ticket. */
uint64_t sc_progress_submit(sc_progress *p, sc_work *w);
/* The ticket of the last work that completed (every work up to it did; p2p works
 * may have completed sooner, below). */
uint64_t sc_progress_completed(sc_progress *p);
/* Waits until work `ticket` completed: SC_OK, SC_ETIMEDOUT after timeout_s, or
 * SC_EINTR when interrupted() (may be NULL) asks to stop. */
int sc_progress_wait(sc_progress *p, uint64_t ticket, double timeout_s, int (*interrupted)(void));
/* Point-to-point works complete as their own messages do, not in ticket order: one
 * is complete when sc_work_finished (its status and ops final) or once
 * sc_progress_completed reaches its ticket.  sc_progress_wait_work waits for that
 * (for any other work, as sc_progress_wait does). */
int sc_work_finished(const sc_work *w);
int sc_progress_wait_work(sc_progress *p, const sc_work *w, double timeout_s,
                          int (*interrupted)(void));
/* Ends the thread once every queued work completed (sc_request_close first makes
 * them give up); waits for it.  p stays readable until sc_progress_free. */
void sc_progress_stop(sc_progress *p);
void sc_progress_free(sc_progress *p);

/* The first mismatch of the job: field, the two ranks, their values, the collective. */
void sc_mismatch_info(const sc_comm *c, int64_t out[6]);
/* This rank's calls so far (the sequence number of the current one). */
uint64_t sc_call_number(const sc_comm *c);
/* Ranks attached to the segment so far (what a join waits to see reach the world size). */
uint64_t sc_attached_count(const sc_comm *c);

/* Ranks that have not arrived: not attached yet, or not yet in our current call. */
int sc_ranks_missing(const sc_comm *c, int *out, int max);

/* Describes the last failure of c's collectives (p2p 0) or of its point-to-point
 * operations (p2p 1): which peer and which wait.  The wait is a phrase that takes
 * the peer as its object ("waiting for data from"). */
int sc_error_peer(const sc_comm *c, int p2p);
int sc_error_waited(const sc_comm *c, int p2p);
const char *sc_error_what(const sc_comm *c, int p2p);
int sc_op_supported(int dtype, int op);
/* Offsets of the segment's parts, for tests that corrupt a live segment on purpose:
 * {attached flag, rank blocks, rank block size, its call slots, call slot size, the
 * call fields in a slot, rank state, rank pid, rank cross-memory verdict}. */
void sc_layout(int64_t out[9]);
/* True when the process is gone or a zombie (kill(pid, 0) alone accepts zombies). */
int sc_pid_dead(int32_t pid);

#endif
