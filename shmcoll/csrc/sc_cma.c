/* Cross-memory attach: one process reads another's private memory with
 * process_vm_readv (Linux 3.2+), so an ordinary array crosses between cores once
 * instead of twice through a channel slot (Open MPI's vader/CMA path does the same).
 *
 * The kernel allows it where ptrace would be allowed (same user, and Yama's
 * ptrace_scope 0, no seccomp filter forbidding the call, a dumpable target), which
 * no rank can know of another without trying.  So once every rank attached, each
 * reads a word of every peer's process and checks that it holds what that peer's
 * rank in this job puts there (a pid of another namespace names another process),
 * writes the same value back (a seccomp filter may allow process_vm_readv and not
 * process_vm_writev, and the schedules use both), publishes its verdict, and waits
 * for the others': the schedules that reach into peers' memory run only when every
 * rank reached every other.  Nothing is widened for it
 * (no PR_SET_PTRACER): a job that may not read its peers keeps the shared-memory
 * path.  Rank 0 also measures, with rank 1, what a read and a write cost against the
 * same bytes' two copies through a channel, for the cost model (the same figures on every
 * rank, so every rank reaches the same choice). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "sc_internal.h"

static double sc_min_d(double a, double b) { return a < b ? a : b; }

#define PROBE_BYTES (64u * 1024u)    /* what one timed copy moves */
#define PROBE_ROUNDS 5               /* best of: a preempted round does not count */
#define PROBE_COPIES 6               /* of PROBE_BYTES each, best of (each on bytes of its own) */

/* What rank `rank` of the job with `token` keeps in its probe word. */
static uint64_t probe_value(uint64_t token, int rank)
{
    return token ^ (0x9e3779b97f4a7c15ull * (uint64_t)(rank + 1));
}

/* All `bytes` between this process's `mine` and `pid`'s `remote`, in the direction
 * given (a call may move less than asked: it goes on from there).  0 or an errno. */
static int move_exact(pid_t pid, uint64_t remote, char *mine, size_t bytes, int writing)
{
    size_t done = 0;
    while (done < bytes) {
        struct iovec local = { mine + done, bytes - done };
        struct iovec theirs = { (void *)(uintptr_t)(remote + done), bytes - done };
        ssize_t n = writing ? process_vm_writev(pid, &local, 1, &theirs, 1, 0)
                            : process_vm_readv(pid, &local, 1, &theirs, 1, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n < 0 ? errno : EFAULT;
        done += (size_t)n;
    }
    return 0;
}

static int read_exact(pid_t pid, uint64_t remote, void *dst, size_t bytes)
{
    return move_exact(pid, remote, dst, bytes, 0);
}

static int reaches(sc_comm *c, int peer)
{
    pid_t pid = atomic_load_explicit(&c->ranks[peer].pid, memory_order_acquire);
    uint64_t where = c->ranks[peer].cma_probe, word = 0;
    return pid > 0 && where && read_exact(pid, where, &word, sizeof word) == 0 &&
           word == probe_value(c->hdr->token, peer) &&
           move_exact(pid, where, (char *)&word, sizeof word, 1) == 0;
}

static double seconds_since(uint64_t t0) { return (double)(sc_now_ns() - t0) * 1e-9; }

/* Seconds of a small read of this process's own memory (the kernel's fixed cost). */
static double small_read(void)
{
    uint64_t a[8] = { 0 }, b[8];
    double best = 1.0;
    for (int i = 0; i < PROBE_ROUNDS; i++) {
        uint64_t t0 = sc_now_ns();
        if (read_exact(getpid(), (uint64_t)(uintptr_t)a, b, sizeof b))
            return -1.0;
        double s = seconds_since(t0);
        best = s < best ? s : best;
    }
    return best;
}

/* The probe's shared bytes: the start of rank 1's ring channel (no call has used it
 * yet; rank 1 reserved it at attach), as an offset into the segment; *piece: the
 * bytes of one timed copy; *rounds: copies (each on bytes of its own). */
static size_t probe_area(const sc_comm *c, size_t *piece, int *rounds)
{
    size_t chan = sc_channel_bytes(c->slot_bytes, c->nslots);
    *piece = sc_max(SC_PAGE, sc_min(PROBE_BYTES, chan / PROBE_COPIES) & ~(size_t)(SC_PAGE - 1));
    *rounds = (int)sc_max(1, sc_min(PROBE_COPIES, chan / *piece));
    return sc_off_slots(c->world) + ((size_t)1 * c->world + 2 % c->world) * chan;
}

static void copy(char *dst, const char *src, size_t bytes)
{
    memcpy(dst, src, bytes);
    __asm__ __volatile__("" : : "r"(dst) : "memory");   /* the copy is not elided */
}

/* Rank 1's half of the probe: a private buffer of its own written (so it is in its
 * cache, as a collective's x is), and copied into the channel as a channel send
 * would, timed.  Publishes both; returns the buffer (freed once the job agreed). */
static char *probe_source(sc_comm *c)
{
    size_t piece;
    int rounds;
    size_t off = probe_area(c, &piece, &rounds);
    char *src = malloc((size_t)rounds * piece);
    if (!src)
        return NULL;
    memset(src, 0x5a, (size_t)rounds * piece);
    double in = 1.0;
    for (int r = 0; r < rounds; r++) {
        uint64_t t0 = sc_now_ns();
        copy(c->base + off + r * piece, src + r * piece, piece);
        in = sc_min_d(in, seconds_since(t0));
    }
    c->ranks[1].cma_src = (uint64_t)(uintptr_t)src;
    c->ranks[1].cma_copy_ps = (uint64_t)(in * 1e12);
    return src;
}

/* Rank 0's half: a cross-memory read of rank 1's private bytes, over what the same
 * bytes cost through a channel (rank 1's copy in + this rank's copy out): ratio[0]
 * for bytes rank 1 has just written, each read once from rank 1's cache (a collective's
 * x, written between calls), ratio[1] for the same bytes read again, unchanged since
 * (an x that stays the same from call to call, as in a benchmark's loop: the reader
 * finds its lines in its own cache and the kernel copies at cache speed); ratio[2]
 * for a write of bytes this rank has just read (so they are in its cache, as a pushed
 * row or reduced block is) into rank 1's (which waits for the verdict meanwhile).
 * Returns 0, or -1 where a read or write failed. */
static int read_ratios(sc_comm *c, double ratio[3])
{
    size_t piece;
    int rounds;
    size_t off = probe_area(c, &piece, &rounds);
    pid_t pid = atomic_load_explicit(&c->ranks[1].pid, memory_order_acquire);
    char *dst = malloc(piece);
    double out = 1.0, fresh = 1.0, again = 1.0, write = 1.0;
    int failed = !dst || !c->ranks[1].cma_src;
    for (int r = 0; r < rounds && !failed; r++) {
        uint64_t src = c->ranks[1].cma_src + r * piece, t0 = sc_now_ns();
        copy(dst, c->base + off + r * piece, piece);
        out = sc_min_d(out, seconds_since(t0));
        t0 = sc_now_ns();
        failed = read_exact(pid, src, dst, piece) != 0;
        fresh = sc_min_d(fresh, seconds_since(t0));
        t0 = sc_now_ns();
        failed = failed || read_exact(pid, src, dst, piece) != 0;
        again = sc_min_d(again, seconds_since(t0));
        t0 = sc_now_ns();
        failed = failed || move_exact(pid, src, dst, piece, 1) != 0;
        write = sc_min_d(write, seconds_since(t0));
    }
    free(dst);
    double channel = out + (double)c->ranks[1].cma_copy_ps * 1e-12;
    ratio[0] = fresh / channel;
    ratio[1] = again / channel;
    ratio[2] = write / channel;
    return failed ? -1 : 0;
}

int sc_cma_agree(sc_comm *c, int allowed, int *agreed, double costs[4])
{
    sc_rank_block *me = &c->ranks[c->rank];
    int verdict = allowed;
    char *source = NULL;
    for (int i = 1; i < c->world && verdict; i++)
        verdict = reaches(c, (c->rank + i) % c->world);
    if (c->rank == 1 && verdict)
        verdict = (source = probe_source(c)) != NULL;
    uint64_t second = SC_CMA_DENIED;
    if (c->rank == 0 && verdict && c->world > 1) {  /* rank 1's half comes first */
        int st = sc_wait_ge(c, &c->ranks[1].cma, SC_CMA_PERMITTED, 1,
                            "waiting for the cross-memory probe of", &second);
        if (st != SC_OK)
            return st;
    }
    if (c->rank == 0 && verdict && second == SC_CMA_PERMITTED) {
        double fixed = small_read(), ratio[3];
        verdict = fixed >= 0 && read_ratios(c, ratio) == 0;
        me->cma_call_ps = verdict ? (uint64_t)(fixed * 1e12) : 0;
        me->cma_ratio_ppm = verdict ? (uint64_t)(ratio[0] * 1e6) : 0;
        me->cma_warm_ppm = verdict ? (uint64_t)(ratio[1] * 1e6) : 0;
        me->cma_write_ppm = verdict ? (uint64_t)(ratio[2] * 1e6) : 0;
    }
    sc_signal(&me->cma, verdict ? SC_CMA_PERMITTED : SC_CMA_DENIED);
    int all = verdict, st = SC_OK;
    for (int i = 1; i < c->world && st == SC_OK; i++) {
        int peer = (c->rank + i) % c->world;
        uint64_t theirs = SC_CMA_DENIED;
        st = sc_wait_ge(c, &c->ranks[peer].cma, SC_CMA_PERMITTED, peer,
                        "waiting for the cross-memory probe of", &theirs);
        all = all && theirs == SC_CMA_PERMITTED;
    }
    free(source);       /* (rank 0 read it before its verdict) */
    *agreed = 0;
    if (st != SC_OK)
        return st;
    if (all && c->world > 1) {
        size_t where = 2 * (size_t)c->world * sizeof(uint64_t);
        c->peer_where = calloc(1, where);
        c->stage = malloc(2 * (size_t)c->slot_bytes);
        if (!c->peer_where || !c->stage) {
            /* Every rank must agree: one without memory for it cannot decline alone. */
            SC_BLAME(c)->peer = -1;
            SC_BLAME(c)->what = "allocating the cross-memory staging of";
            return SC_ENOMEM;
        }
        c->cma = *agreed = 1;
        costs[0] = (double)c->ranks[0].cma_call_ps * 1e-12;
        costs[1] = (double)c->ranks[0].cma_ratio_ppm * 1e-6;
        costs[2] = (double)c->ranks[0].cma_warm_ppm * 1e-6;
        costs[3] = (double)c->ranks[0].cma_write_ppm * 1e-6;
    }
    return SC_OK;
}

void sc_cma_publish(sc_comm *c)
{
    c->cma_word = probe_value(c->hdr->token, c->rank);
    c->ranks[c->rank].cma_probe = (uint64_t)(uintptr_t)&c->cma_word;
    c->ranks[c->rank].cma_base = (uint64_t)(uintptr_t)c->base;
}

static int moved(sc_comm *c, int q, int err, int writing)
{
    if (!err)
        return SC_OK;
    /* The peer is inside this call (its call was checked) and keeps its buffers
     * until every rank passed the closing barrier, so a failed read or write means
     * it died or can no longer be reached: the job cannot go on. */
    sc_abort_failed(c->hdr, q);
    SC_BLAME(c)->peer = SC_BLAME(c)->waited = q;
    if (writing)
        SC_BLAME(c)->what = err == ESRCH ? "writing with cross-memory attach (the process is gone) into the buffer of"
                                   : "writing with cross-memory attach (refused) into the buffer of";
    else
        SC_BLAME(c)->what = err == ESRCH ? "reading with cross-memory attach (the process is gone) the buffer of"
                                   : "reading with cross-memory attach (refused) the buffer of";
    return SC_EPEERLOST;
}

int sc_cma_read(sc_comm *c, int q, uint64_t remote, void *dst, size_t bytes)
{
    pid_t pid = atomic_load_explicit(&c->ranks[q].pid, memory_order_relaxed);
    return moved(c, q, move_exact(pid, remote, dst, bytes, 0), 0);
}

int sc_cma_write(sc_comm *c, int q, uint64_t remote, const void *src, size_t bytes)
{
    pid_t pid = atomic_load_explicit(&c->ranks[q].pid, memory_order_relaxed);
    return moved(c, q, move_exact(pid, remote, (char *)src, bytes, 1), 1);
}
