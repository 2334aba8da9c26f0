/* Waiting for a flag: spin, then yield, then sleep on a futex — always with a deadline.
 *
 * On a small VM a spinning waiter sees a flag a fraction of a microsecond after it
 * is set, a yielding one about a microsecond, a futex sleeper tens of microseconds
 * (SHMCOLL_SPIN_US / SHMCOLL_YIELD_US tune the phases).  Spinning is right while the peer is
 * running on another core; once ranks outnumber cores the peer we wait for may be
 * queued behind us, so we yield the core to it, and after a longer wait we sleep so
 * that an idle rank costs no CPU at all.  Liveness of the peer, the job-wide
 * abort flag and pending signals (Ctrl-C) are checked whenever we wake from a
 * sleep slice, so a long wait stays interruptible. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "sc_internal.h"

#define SLEEP_SLICE_NS 20000000ull   /* 20 ms: bounds how late a dead peer is noticed */

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
static inline void cpu_relax(void) { _mm_pause(); }
#elif defined(__aarch64__)
static inline void cpu_relax(void) { __asm__ __volatile__("yield"); }
#else
static inline void cpu_relax(void) {}
#endif

uint64_t sc_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The futex word is the low half of the 64-bit flag (x86-64 and aarch64 are
 * little-endian); it changes whenever the flag does, except on an exact 2^32 wrap,
 * which only costs one sleep slice. */
static void futex_sleep(_Atomic uint64_t *word, uint32_t expected, uint64_t ns)
{
    struct timespec ts = { (time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull) };
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, expected, &ts, NULL, 0);
}

static void futex_wake_all(_Atomic uint64_t *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

void sc_wake(sc_flag *f)
{
    /* Pairs with the waiter's increment of `waiters` before its last check:
     * either it sees the new value, or we see it asleep and wake it. */
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&f->waiters, memory_order_relaxed))
        futex_wake_all(&f->value);
}

void sc_signal(sc_flag *f, uint64_t value)
{
    atomic_store_explicit(&f->value, value, memory_order_release);
    sc_wake(f);
}

/* A process that exited but was not reaped yet (a zombie) still answers kill(pid, 0):
 * its state letter in /proc/<pid>/stat tells. */
int sc_pid_dead(int32_t pid)
{
    if (kill(pid, 0) != 0)
        return errno == ESRCH;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *end = strrchr(buf, ')');   /* the command name may contain spaces */
    return end && end[1] == ' ' && (end[2] == 'Z' || end[2] == 'X');
}

static int peer_gone(sc_comm *c, int peer)
{
    if (peer < 0 || peer >= c->world)
        return 0;
    sc_rank_block *rb = &c->ranks[peer];
    int32_t state = atomic_load_explicit(&rb->state, memory_order_acquire);
    if (state == SC_RANK_CLOSED || state == SC_RANK_FAILED)
        return 1;
    /* A rank that gave up on a call is broken: what it has not written, it never will. */
    if (atomic_load_explicit(&rb->abandoned, memory_order_acquire))
        return 1;
    int32_t pid = atomic_load_explicit(&rb->pid, memory_order_relaxed);
    return pid > 0 && sc_pid_dead(pid);
}

/* Blames `culprit` for a failure that ended our wait for `waited` (the same rank
 * unless the job was aborted because of another one). */
static int fail_on(sc_comm *c, int status, int culprit, int waited, const char *what)
{
    SC_BLAME(c)->peer = culprit;
    SC_BLAME(c)->waited = waited;
    SC_BLAME(c)->what = what;
    return status;
}

static int fail(sc_comm *c, int status, int peer, const char *what)
{
    return fail_on(c, status, peer, peer, what);
}

/* The deadline of a wait that started at `start`; a timeout too long to count in
 * nanoseconds (infinity included) never expires. */
static uint64_t deadline_of(uint64_t start, double timeout_s)
{
    if (!(timeout_s < (double)(UINT64_MAX - start) / 1e9))
        return UINT64_MAX;
    return start + (uint64_t)(timeout_s * 1e9);
}

static inline int reached(sc_flag *f, uint64_t target, uint64_t *seen)
{
    uint64_t v = atomic_load_explicit(&f->value, memory_order_acquire);
    *seen = v;
    return v >= target;
}

/* The job's abort, if any, as this wait's failure (SC_OK: the job is not aborted). */
static int aborted(sc_comm *c, int peer, const char *what)
{
    uint64_t reason = atomic_load_explicit(&c->hdr->abort.value, memory_order_acquire);
    if (reason == SC_ABORT_MISMATCH)
        return fail(c, SC_EMISMATCH, peer, what);
    if (reason == SC_ABORT_REFUSED)
        return fail(c, SC_EREFUSED, peer, what);
    if (reason)
        return c->hdr->failed_rank >= 0 ? fail_on(c, SC_EPEERLOST, c->hdr->failed_rank, peer, what)
                                        : fail(c, SC_EABORTED, peer, what);
    return SC_OK;
}

/* Why a wait on `peer`'s flag f (for target) must give up now (SC_OK: it may go on). */
static int give_up(sc_comm *c, sc_flag *f, uint64_t target, int peer, const char *what)
{
    SC_TRY(aborted(c, peer, what));
    /* Signal handlers run first: one of them may close the communicator.  The
     * progress thread has none to run (signals go to the caller's threads). */
    if (c->params.interrupted && !sc_on_progress_thread && c->params.interrupted())
        return fail(c, SC_EINTR, peer, what);
    if (atomic_load_explicit(&c->closing, memory_order_acquire))
        return fail(c, SC_ECLOSED, peer, what);
    uint64_t v;
    /* A peer that wrote the flag and then left is not lost: it may have finished its
     * last call and closed between our look at the flag and at its state.  Its state
     * is stored after its last write (release) and read here first (acquire), so the
     * flag read after it sees that write. */
    if (peer_gone(c, peer) && !reached(f, target, &v)) {
        /* Ranks waiting on someone else would otherwise blame whoever
         * gives up next; the job is aborted naming the rank that is gone —
         * or the one recorded first: a peer that gave up because another
         * rank died recorded that rank before it gave up (sc_run). */
        sc_abort_failed(c->hdr, peer);
        return aborted(c, peer, what);
    }
    return SC_OK;
}

/* The busy phases of a wait that started at `start`: spin, then yield, until the flag
 * reaches target (1) or the phases are over (0, *now is the time then). */
static inline int poll_phases(sc_flag *f, uint64_t target, uint64_t start, uint64_t spin_ns,
                              uint64_t yield_ns, uint64_t *v, uint64_t *now)
{
    while (*now - start < spin_ns) {
        for (int i = 0; i < 64; i++) {
            cpu_relax();
            if (reached(f, target, v))
                return 1;
        }
        *now = sc_now_ns();
    }
    while (*now - start < spin_ns + yield_ns) {
        sched_yield();
        if (reached(f, target, v))
            return 1;
        *now = sc_now_ns();
    }
    return 0;
}

void sc_hold(sc_comm *c, uint64_t hold_ns, void (*release)(void *), void *arg)
{
    c->release = release;
    c->release_arg = arg;
    c->hold_ns = hold_ns;
}

/* A wait of this thread has lasted past the hold: the caller's lock goes, once
 * (never on the progress thread, which holds none). */
static inline void let_go(sc_comm *c)
{
    if (!sc_on_progress_thread && c->release) {
        void (*release)(void *) = c->release;
        c->release = NULL;
        release(c->release_arg);
    }
}

/* The spin of a wait that holds the caller's lock: at most hold_ns (within the spin
 * budget), then the lock goes; whether the flag reached target meanwhile. */
static inline int hold_phase(sc_comm *c, sc_flag *f, uint64_t target, uint64_t start,
                             uint64_t spin_ns, uint64_t *v, uint64_t *now)
{
    uint64_t hold = c->hold_ns < spin_ns ? c->hold_ns : spin_ns;
    while (*now - start < hold) {
        for (int i = 0; i < 64; i++) {
            cpu_relax();
            if (reached(f, target, v))
                return 1;
        }
        *now = sc_now_ns();
    }
    let_go(c);
    return 0;
}

/* One sleep on the flag's futex, at most `ns`; whether it reached target then. */
static inline int sleep_once(sc_flag *f, uint64_t target, uint64_t ns, uint64_t *v)
{
    atomic_fetch_add_explicit(&f->waiters, 1, memory_order_seq_cst);
    *v = atomic_load_explicit(&f->value, memory_order_seq_cst);
    if (*v < target)
        futex_sleep(&f->value, (uint32_t)*v, ns);
    atomic_fetch_sub_explicit(&f->waiters, 1, memory_order_relaxed);
    return reached(f, target, v);
}

int sc_wait_ge(sc_comm *c, sc_flag *f, uint64_t target, int peer, const char *what, uint64_t *seen)
{
    uint64_t v;
    if (reached(f, target, &v))
        goto done;

    uint64_t start = sc_now_ns(), now = start;
    uint64_t spin_ns = c->params.spin_ns, yield_ns = c->params.yield_ns;
    if (sc_on_progress_thread) {
        spin_ns = sc_progress_spin_ns;
        yield_ns = sc_progress_yield_ns;
    }
    /* (a progress thread never reads the hold: the caller may set it meanwhile) */
    if (!sc_on_progress_thread && c->release && hold_phase(c, f, target, start, spin_ns, &v, &now))
        goto done;
    if (poll_phases(f, target, start, spin_ns, yield_ns, &v, &now))
        goto done;
    uint64_t deadline = deadline_of(start, c->params.timeout_s);
    for (;;) {
        if (sleep_once(f, target, SLEEP_SLICE_NS, &v))
            goto done;
        SC_TRY(give_up(c, f, target, peer, what));
        if (sc_now_ns() >= deadline)
            return fail(c, SC_ETIMEDOUT, peer, what);
    }
done:
    if (seen)
        *seen = v;
    return SC_OK;
}

int sc_wait_local(sc_flag *f, uint64_t target, uint64_t spin_ns, uint64_t yield_ns,
                  double timeout_s, int (*interrupted)(void))
{
    uint64_t v, start = sc_now_ns(), now = start;
    if (reached(f, target, &v))
        return SC_OK;
    /* A short timeout (a caller polling) bounds the busy phases too. */
    uint64_t deadline = deadline_of(start, timeout_s), busy = deadline - start;
    spin_ns = spin_ns < busy ? spin_ns : busy;
    yield_ns = yield_ns < busy - spin_ns ? yield_ns : busy - spin_ns;
    if (poll_phases(f, target, start, spin_ns, yield_ns, &v, &now))
        return SC_OK;
    for (; now < deadline; now = sc_now_ns()) {
        if (sleep_once(f, target, sc_min(deadline - now, SLEEP_SLICE_NS), &v))
            return SC_OK;
        if (interrupted && interrupted())
            return SC_EINTR;
    }
    return SC_ETIMEDOUT;
}

/* Index of the first flag that reached its target, or -1. */
static int first_reached(sc_flag *const *flags, const uint64_t *targets, int n)
{
    uint64_t v;
    for (int i = 0; i < n; i++)
        if (reached(flags[i], targets[i], &v))
            return i;
    return -1;
}

#define ANY_SLICE_NS 1000000ull   /* 1 ms: a sleeper watches one flag, and looks at all */

int sc_wait_any(sc_comm *c, sc_flag *const *flags, const uint64_t *targets, const int *peers,
                int n, const char *what, int *waited)
{
    if (n == 1) {
        *waited = 0;
        return sc_wait_ge(c, flags[0], targets[0], peers[0], what, NULL);
    }
    uint64_t start = sc_now_ns(), now = start, v;
    uint64_t spin_ns = sc_on_progress_thread ? sc_progress_spin_ns : c->params.spin_ns;
    uint64_t yield_ns = sc_on_progress_thread ? sc_progress_yield_ns : c->params.yield_ns;
    uint64_t deadline = deadline_of(start, c->params.timeout_s);
    for (uint64_t turn = 0;; turn++) {
        if ((*waited = first_reached(flags, targets, n)) >= 0)
            return SC_OK;
        if (!sc_on_progress_thread && c->release &&
            now - start >= (c->hold_ns < spin_ns ? c->hold_ns : spin_ns))
            let_go(c);
        if (now - start < spin_ns) {
            for (int i = 0; i < 64; i++)
                cpu_relax();
        } else if (now - start < spin_ns + yield_ns) {
            sched_yield();
        } else {
            /* One futex at a time, in turn, briefly: a change of any other flag is
             * seen within a slice. */
            int i = (int)(turn % (uint64_t)n);
            if (sleep_once(flags[i], targets[i], ANY_SLICE_NS, &v)) {
                *waited = i;
                return SC_OK;
            }
            for (int j = 0; j < n; j++)
                SC_TRY(give_up(c, flags[j], targets[j], peers[j], what));
            if (sc_now_ns() >= deadline)
                return fail(c, SC_ETIMEDOUT, peers[0], what);
        }
        now = sc_now_ns();
    }
}
