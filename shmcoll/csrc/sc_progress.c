/* sc_progress: nonblocking calls run by one progress thread per communicator.
 *
 * The caller queues a work (an sc_args and room for its outcome) and goes on; the
 * thread takes works in submission order and runs each with sc_run or sc_barrier,
 * exactly the code a blocking call runs, so both kinds of call keep one sequence of
 * calls per rank and mix freely.  The thread is plain C: it never needs the GIL, so a
 * rank computing in numpy (which drops the GIL) or in C keeps its peers moving.
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
    SC_ALONE sc_flag issued;
    SC_ALONE sc_flag completed;
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
        w->err_peer = c->err_peer;
        w->err_waited = c->err_waited;
        w->err_what = c->err_what;
        p->failed = st;
        p->failure = *w;
    }
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
