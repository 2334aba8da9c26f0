/* sc_progress: nonblocking calls run by a progress thread, one per queue.
 *
 * The caller queues a work (an sc_args and room for its outcome) and goes on; the
 * thread takes works in submission order and runs each with sc_run, sc_barrier or
 * sc_p2p_run, exactly the code a blocking call runs, so both kinds of call keep one
 * sequence of calls per rank and mix freely.  A communicator may have two queues,
 * one for collectives and one for point-to-point works (the engine's choice): the two
 * use channels of their own and each kind keeps its own failure details (sc_blame),
 * so they run at once and neither waits for the other, as in MPI.  The thread is
 * plain C: it never needs the GIL, so a rank computing in numpy (which drops the GIL)
 * or in C keeps its peers moving.
 *
 * Two counters tell the caller everything: `issued` (works queued, the thread sleeps
 * on it) and `completed` (works done, callers sleep on it).  A work's outcome is
 * written before `completed` passes its ticket (release), read after (acquire), and
 * the thread never touches a work again after that, so the caller may free it then. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>

#include "sc_internal.h"

_Thread_local int sc_on_progress_thread;
_Thread_local uint64_t sc_progress_spin_ns, sc_progress_yield_ns;

struct sc_progress {
    sc_comm *c;
    pthread_t thread;
    pthread_mutex_t lock;      /* guards the queue links only */
    sc_work *head, *tail;
    sc_work stop;              /* queued last by sc_progress_stop: the thread ends */
    uint64_t taken;            /* the thread's: works taken off the queue */
    int running;               /* the thread was started and not joined yet */
    uint64_t spin_ns;          /* how long any thread of the queue busy-polls */
    uint64_t yield_ns;         /* c's, kept for callers' waits after c is detached */
    int failed;                /* the first failure's status; later works are skipped */
    sc_work failure;           /* its error details */
    uint64_t settled;          /* the thread's: point-to-point works it completed */
    SC_ALONE sc_flag issued;
    SC_ALONE sc_flag completed;
    SC_ALONE sc_flag p2p_settled;  /* reaches `settled` as each p2p work completes */
};

/* Outcome of a work that is not run: the first failure's, or closed. */
static void skip(sc_progress *p, sc_work *w, int status)
{
    w->status = status;
    w->skipped = 1;
    w->err_peer = p->failure.err_peer;
    w->err_waited = p->failure.err_waited;
    w->err_what = p->failure.err_what;
}

static void run(sc_progress *p, sc_work *w)
{
    sc_comm *c = p->c;
    if (p->failed) {
        skip(p, w, p->failed);
        return;
    }
    if (atomic_load_explicit(&c->closing, memory_order_acquire)) {
        p->failure.err_peer = p->failure.err_waited = -1;
        p->failure.err_what = "queued";
        p->failed = SC_ECLOSED;
        skip(p, w, SC_ECLOSED);
        return;
    }
    int st = w->args.collective == SC_COLL_BARRIER ? sc_barrier(c) : sc_run(c, &w->args);
    w->status = st;
    w->skipped = 0;
    if (st != SC_OK) {
        w->err_peer = c->blame[0].peer;
        w->err_waited = c->blame[0].waited;
        w->err_what = c->blame[0].what;
        p->failed = st;
        p->failure = *w;
    }
}

/* Point-to-point works run as one group with the p2p works queued right behind
 * them (also those queued while the group is stuck), so that an isend and the
 * irecv issued after it progress together, as a blocking sendrecv would. */
#define P2P_GROUP_OPS 256
#define P2P_GROUP_WORKS 128

typedef struct p2p_batch {
    sc_progress *p;
    sc_work *works[P2P_GROUP_WORKS];   /* the group's works not completed yet */
    int nworks;
    uint64_t last;          /* the ticket of the last work the group took */
    uint64_t looked;        /* works issued when the queue was last looked at */
} p2p_batch;

/* The next queued work, if it is a p2p work whose ops fit: taken off the queue. */
static sc_work *take_p2p(sc_progress *p, int room)
{
    sc_work *w = NULL;
    pthread_mutex_lock(&p->lock);
    if (p->head && p->head != &p->stop && p->head->args.collective == SC_WORK_P2P &&
        p->head->nops <= room) {
        w = p->head;
        p->head = w->next;
        if (!p->head)
            p->tail = NULL;
        p->taken++;
    }
    pthread_mutex_unlock(&p->lock);
    return w;
}

static int absorb(void *ctx, sc_p2p_op **ops, int n, int cap, sc_flag **wake, uint64_t *target)
{
    p2p_batch *b = ctx;
    sc_work *w;
    /* read before looking: a work issued after it wakes the group's next wait */
    b->looked = atomic_load_explicit(&b->p->issued.value, memory_order_acquire);
    while (b->nworks < P2P_GROUP_WORKS && (w = take_p2p(b->p, cap - n))) {
        b->works[b->nworks++] = w;
        b->last = w->ticket;
        for (int i = 0; i < w->nops; i++)
            ops[n++] = &w->ops[i];
    }
    if (wake && b->nworks < P2P_GROUP_WORKS) {
        *wake = &b->p->issued;
        *target = b->looked + 1;
    }
    return n;
}

/* A work's outcome after its group ran: its first op that did not succeed (a
 * message that did not match), or the group's failure if any op of it was cut off. */
static void settle_p2p(sc_progress *p, sc_work *w, int group_status)
{
    int cut_off = 0, first_bad = SC_OK;
    for (int i = 0; i < w->nops; i++) {
        int st = w->ops[i].status;
        if (st < 0)
            cut_off = 1;
        else if (st != SC_OK && first_bad == SC_OK)
            first_bad = st;
    }
    w->status = cut_off ? group_status : first_bad;
    w->skipped = 0;
    if (w->status != SC_OK) {
        const sc_blame *b = &p->c->blame[1];
        w->err_peer = b->peer;
        w->err_waited = b->waited;
        w->err_what = b->what;
    }
}

/* A p2p work completes as soon as its own ops did (a send once its message is in
 * the channel, a receive once its message arrived), as MPI's isend and irecv do:
 * its waiter must not wait for the rest of its group, which may need what that
 * waiter does next (an irecv posted first, then sends the peer must receive before
 * it answers).  The work stays alive (its caller keeps it until `completed` passes
 * its ticket), but the group no longer touches it. */
static void publish_p2p(sc_progress *p, sc_work *w)
{
    atomic_store_explicit(&w->finished, 1, memory_order_release);
    sc_signal(&p->p2p_settled, ++p->settled);
}

static int ops_finished(const sc_work *w)
{
    for (int i = 0; i < w->nops; i++)
        if (w->ops[i].status < 0)
            return 0;
    return 1;
}

/* sc_p2p_run's hook: the works whose ops all finished complete now. */
static void finished(void *ctx)
{
    p2p_batch *b = ctx;
    int kept = 0;
    for (int i = 0; i < b->nworks; i++) {
        if (ops_finished(b->works[i])) {
            settle_p2p(b->p, b->works[i], SC_OK);
            publish_p2p(b->p, b->works[i]);
        } else
            b->works[kept++] = b->works[i];
    }
    b->nworks = kept;
}

static void run_p2p(sc_progress *p, sc_work *first)
{
    static _Thread_local p2p_batch b;
    sc_p2p_op *ops[P2P_GROUP_OPS];
    int n = 0;
    b.p = p;
    b.nworks = 1;
    b.works[0] = first;
    b.last = first->ticket;
    for (int i = 0; i < first->nops && n < P2P_GROUP_OPS; i++)
        ops[n++] = &first->ops[i];
    n = absorb(&b, ops, n, P2P_GROUP_OPS, NULL, NULL);
    int st = p->failed ? p->failed : SC_OK;
    if (st == SC_OK && atomic_load_explicit(&p->c->closing, memory_order_acquire)) {
        p->failure.err_peer = p->failure.err_waited = -1;
        p->failure.err_what = "queued";
        st = p->failed = SC_ECLOSED;
    }
    if (st != SC_OK) {
        for (int i = 0; i < b.nworks; i++)
            skip(p, b.works[i], st);
    } else {
        st = sc_p2p_run(p->c, ops, n, P2P_GROUP_OPS, absorb, finished, &b);
        for (int i = 0; i < b.nworks; i++)
            settle_p2p(p, b.works[i], st);
        if (st != SC_OK) {
            p->failed = st;
            p->failure.err_peer = p->c->blame[1].peer;
            p->failure.err_waited = p->c->blame[1].waited;
            p->failure.err_what = p->c->blame[1].what;
        }
        for (int i = 0; i < b.nworks; i++)
            publish_p2p(p, b.works[i]);
    }
    /* each work may be freed once completed passes it: the ticket was read before */
    sc_signal(&p->completed, b.last);
    sc_signal(&p->p2p_settled, ++p->settled);
}

static sc_work *take(sc_progress *p)
{
    /* An idle thread spins (when cores are spare) then sleeps without yielding: the
     * core is better left to the computation the caller overlaps. */
    sc_wait_local(&p->issued, p->taken + 1, p->spin_ns, 0, INFINITY, NULL);
    pthread_mutex_lock(&p->lock);
    sc_work *w = p->head;
    p->head = w->next;
    if (!p->head)
        p->tail = NULL;
    pthread_mutex_unlock(&p->lock);
    p->taken++;
    return w;
}

static void *progress_main(void *arg)
{
    sc_progress *p = arg;
    sc_on_progress_thread = 1;
    sc_progress_spin_ns = p->spin_ns;
    sc_progress_yield_ns = p->yield_ns;
    for (;;) {
        sc_work *w = take(p);
        if (w == &p->stop)
            return NULL;
        if (w->args.collective == SC_WORK_P2P) {
            run_p2p(p, w);
            continue;
        }
        run(p, w);
        uint64_t ticket = w->ticket;   /* w may be freed once completed passes it */
        sc_signal(&p->completed, ticket);
    }
}

sc_progress *sc_progress_start(sc_comm *c, uint64_t spin_ns, int *err)
{
    sc_progress *p = calloc(1, sizeof *p);
    if (!p) {
        *err = ENOMEM;
        return NULL;
    }
    p->c = c;
    p->spin_ns = spin_ns;
    p->yield_ns = c->params.yield_ns;
    pthread_mutex_init(&p->lock, NULL);
    /* The thread inherits a mask that blocks every signal, so they keep going to the
     * caller's threads, where Python's handlers run. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    *err = pthread_create(&p->thread, NULL, progress_main, p);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (*err) {
        pthread_mutex_destroy(&p->lock);
        free(p);
        return NULL;
    }
    p->running = 1;
    return p;
}

uint64_t sc_progress_submit(sc_progress *p, sc_work *w)
{
    w->next = NULL;
    atomic_store_explicit(&w->finished, 0, memory_order_relaxed);
    w->status = SC_OK;
    w->skipped = 0;
    w->err_peer = w->err_waited = -1;
    w->err_what = "";
    pthread_mutex_lock(&p->lock);
    w->ticket = atomic_load_explicit(&p->issued.value, memory_order_relaxed) + 1;
    if (p->tail)
        p->tail->next = w;
    else
        p->head = w;
    p->tail = w;
    sc_signal(&p->issued, w->ticket);
    pthread_mutex_unlock(&p->lock);
    return w->ticket;
}

int sc_progress_wait_work(sc_progress *p, const sc_work *w, double timeout_s,
                          int (*interrupted)(void))
{
    if (w->args.collective != SC_WORK_P2P)
        return sc_progress_wait(p, w->ticket, timeout_s, interrupted);
    double end = (double)sc_now_ns() * 1e-9 + timeout_s;
    for (;;) {
        /* read before looking: a completion after the look moves it on */
        uint64_t seen = atomic_load_explicit(&p->p2p_settled.value, memory_order_acquire);
        if (sc_work_finished(w) || sc_progress_completed(p) >= w->ticket)
            return SC_OK;
        double left = end - (double)sc_now_ns() * 1e-9;
        if (!(left > 0))
            return SC_ETIMEDOUT;
        int st = sc_wait_local(&p->p2p_settled, seen + 1, 0, p->yield_ns, left, interrupted);
        if (st != SC_OK && st != SC_ETIMEDOUT)
            return st;
    }
}

int sc_work_finished(const sc_work *w)
{
    return atomic_load_explicit(&w->finished, memory_order_acquire);
}

uint64_t sc_progress_completed(sc_progress *p)
{
    return atomic_load_explicit(&p->completed.value, memory_order_acquire);
}

int sc_progress_wait(sc_progress *p, uint64_t ticket, double timeout_s, int (*interrupted)(void))
{
    /* The caller yields rather than spins: its core may be the one the progress thread
     * needs, and a yield costs nothing when that thread runs elsewhere. */
    return sc_wait_local(&p->completed, ticket, 0, p->yield_ns, timeout_s, interrupted);
}

void sc_progress_stop(sc_progress *p)
{
    if (!p || !p->running)
        return;
    p->stop.args.collective = 0;
    sc_progress_submit(p, &p->stop);
    pthread_join(p->thread, NULL);
    p->running = 0;
}

void sc_progress_free(sc_progress *p)
{
    if (!p)
        return;
    sc_progress_stop(p);
    pthread_mutex_destroy(&p->lock);
    free(p);
}
