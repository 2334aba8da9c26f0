/* sc_run: the single entry of every collective.
 *
 * Resolves the kernels, refuses a broken communicator, publishes the call (so
 * peers can check it), completes world == 1 locally, runs the schedule of
 * (collective, algorithm), then checks the calls of every peer it has not checked
 * yet (those it only sent to, and those it exchanged nothing with), and that no
 * peer gave the call up.  A failure half-way marks the communicator broken: its
 * channels are mid-stream and no later call could make sense of them.  The call is
 * recorded as given up, so that peers fail it too. */
#include <string.h>

#include "sc_copy.h"
#include "sc_internal.h"
#include "sc_reduce.h"

static const sc_schedule schedules[SC_NCOLLECTIVES][SC_NALGOS] = {
    [SC_COLL_ALLREDUCE] = {
        [SC_ALGO_RING] = sc_ring_allreduce,
        [SC_ALGO_DIRECT] = sc_direct_allreduce,
        [SC_ALGO_DIRECT_TWO_SHOT] = sc_direct_two_shot,
        [SC_ALGO_TREE] = sc_rooted_allreduce,
        [SC_ALGO_RHD_DOUBLING] = sc_rhd_allreduce,
        [SC_ALGO_RHD_HALVING] = sc_rhd_allreduce,
        [SC_ALGO_NAIVE] = sc_rooted_allreduce,
        [SC_ALGO_SYMMETRIC] = sc_single_copy_allreduce,
        [SC_ALGO_SYMMETRIC_TWO_SHOT] = sc_single_copy_two_shot,
        [SC_ALGO_CMA] = sc_single_copy_allreduce,
        [SC_ALGO_CMA_TWO_SHOT] = sc_single_copy_two_shot,
        [SC_ALGO_DIRECT_INLINE] = sc_inline_allreduce,
        [SC_ALGO_DIRECT_EAGER] = sc_inline_allreduce,
    },
    [SC_COLL_REDUCE_SCATTER] = {
        [SC_ALGO_RING] = sc_ring_reduce_scatter,
        [SC_ALGO_DIRECT] = sc_direct_reduce_scatter,
        [SC_ALGO_RHD_HALVING] = sc_rhd_reduce_scatter,
        [SC_ALGO_SYMMETRIC] = sc_single_copy_reduce_scatter,
        [SC_ALGO_CMA] = sc_single_copy_reduce_scatter,
        [SC_ALGO_DIRECT_INLINE] = sc_inline_reduce_scatter,
        [SC_ALGO_DIRECT_EAGER] = sc_inline_reduce_scatter,
    },
    [SC_COLL_ALLGATHER] = {
        [SC_ALGO_RING] = sc_ring_allgather,
        [SC_ALGO_DIRECT] = sc_direct_allgather,
        [SC_ALGO_RHD_DOUBLING] = sc_rhd_allgather,
        [SC_ALGO_SYMMETRIC] = sc_single_copy_allgather,
        [SC_ALGO_CMA] = sc_single_copy_allgather,
        [SC_ALGO_DIRECT_INLINE] = sc_inline_allgather,
        [SC_ALGO_DIRECT_EAGER] = sc_inline_allgather,
    },
    [SC_COLL_BROADCAST] = {
        [SC_ALGO_RING] = sc_rooted_broadcast,
        [SC_ALGO_DIRECT] = sc_rooted_broadcast,
        [SC_ALGO_TREE] = sc_rooted_broadcast,
        [SC_ALGO_SYMMETRIC] = sc_single_copy_broadcast,
        [SC_ALGO_CMA] = sc_single_copy_broadcast,
        [SC_ALGO_DIRECT_INLINE] = sc_inline_broadcast,
        [SC_ALGO_DIRECT_EAGER] = sc_inline_broadcast,
    },
    [SC_COLL_REDUCE] = {
        [SC_ALGO_RING] = sc_rooted_reduce,
        [SC_ALGO_DIRECT] = sc_rooted_reduce,
        [SC_ALGO_TREE] = sc_rooted_reduce,
        [SC_ALGO_SYMMETRIC] = sc_single_copy_reduce,
        [SC_ALGO_CMA] = sc_single_copy_reduce,
        [SC_ALGO_DIRECT_INLINE] = sc_inline_reduce,
        [SC_ALGO_DIRECT_EAGER] = sc_inline_reduce,
    },
    [SC_COLL_GATHER] = {
        [SC_ALGO_DIRECT] = sc_rooted_gather,
        [SC_ALGO_TREE] = sc_rooted_gather,
        [SC_ALGO_SYMMETRIC] = sc_single_copy_gather,
        [SC_ALGO_CMA] = sc_single_copy_gather,
        [SC_ALGO_DIRECT_INLINE] = sc_inline_gather,
        [SC_ALGO_DIRECT_EAGER] = sc_inline_gather,
    },
    [SC_COLL_SCATTER] = {
        [SC_ALGO_DIRECT] = sc_rooted_scatter,
        [SC_ALGO_TREE] = sc_rooted_scatter,
        [SC_ALGO_DIRECT_INLINE] = sc_inline_scatter,
        [SC_ALGO_DIRECT_EAGER] = sc_inline_scatter,
    },
    [SC_COLL_ALLTOALL] = {
        [SC_ALGO_DIRECT] = sc_direct_alltoall,
        [SC_ALGO_BRUCK] = sc_bruck_alltoall,
        [SC_ALGO_DIRECT_INLINE] = sc_inline_alltoall,
        [SC_ALGO_DIRECT_EAGER] = sc_inline_alltoall,
    },
    [SC_COLL_ALLTOALLV] = {
        [SC_ALGO_DIRECT] = sc_direct_alltoallv,
    },
};

static sc_schedule schedule_of(int collective, int algo)
{
    if (collective < 0 || collective >= SC_NCOLLECTIVES || algo < 0 || algo >= SC_NALGOS)
        return NULL;
    return schedules[collective][algo];
}

int sc_implements(int collective, int algo) { return schedule_of(collective, algo) != NULL; }

static int reducing(int collective)
{
    return collective == SC_COLL_ALLREDUCE || collective == SC_COLL_REDUCE_SCATTER ||
           collective == SC_COLL_REDUCE;
}

/* world == 1: the result is x itself. */
static void run_alone(const sc_args *a, const sc_kernels *k)
{
    size_t bytes = k ? a->count * k->itemsize : a->count;
    if (a->collective == SC_COLL_ALLTOALLV) {   /* layout: {send off, len, recv off, len} */
        memmove((char *)a->out + a->layout[2], (const char *)a->x + a->layout[0], a->layout[3]);
        return;
    }
    if (a->collective != SC_COLL_BROADCAST && a->out != a->x)
        memmove(a->out, a->x, bytes);
}

int sc_run(sc_comm *c, const sc_args *a)
{
    sc_schedule run = schedule_of(a->collective, a->algo);
    const sc_kernels *k = NULL;
    if (!run || (a->root >= c->world) || (a->root < 0 && a->root != -1))
        return SC_EINVAL;
    if (reducing(a->collective) && !(k = sc_kernels_for(a->dtype, a->op)))
        return SC_EINVAL;
    if (c->broken)
        return SC_EBROKEN;
    int symmetric = a->algo == SC_ALGO_SYMMETRIC || a->algo == SC_ALGO_SYMMETRIC_TWO_SHOT;
    if (symmetric && (!a->sym_x || (a->algo == SC_ALGO_SYMMETRIC_TWO_SHOT && !a->sym_out)))
        return SC_EINVAL;
    if (sc_is_cma(a->algo) && !c->cma)
        return SC_EINVAL;   /* the job did not agree that every rank may read every other */
    int inline_ = a->algo == SC_ALGO_DIRECT_INLINE, eager = a->algo == SC_ALGO_DIRECT_EAGER;
    size_t part = inline_ || eager ? sc_inline_part_bytes(a, k, c->world) : 0;
    if ((inline_ && part > SC_INLINE_BYTES) || (eager && part > SC_EAGER_BYTES))
        return SC_EINVAL;
    if (eager && c->world > 1 && part && sc_eager_publishes(a, c->rank))  /* (before the record) */
        memcpy(sc_eager_part(c, c->rank, c->call_seq + 1), a->x, part);
    sc_call_begin(c, a->collective, (int64_t)a->count, a->dtype, a->op, a->root, a->algo,
                  symmetric ? a->sym_x_id : -1, symmetric ? a->sym_out_id : -1,
                  sc_is_cma(a->algo) ? a->x : NULL, sc_is_cma(a->algo) ? a->out : NULL,
                  a->x, a->x && inline_ ? part : 0);  /* (Scatter: no x but the root's) */
    if (c->world == 1) {
        run_alone(a, k);
        return SC_OK;
    }
    sc_args cma;
    if (sc_is_cma(a->algo)) {   /* peers' buffers are reached by address, never as symmetric */
        cma = *a;
        cma.sym_x = cma.sym_out = NULL;
        a = &cma;
    }
    int st = run(c, a, k);
    sc_stream_fence();
    if (st == SC_OK)
        st = sc_call_check_all(c);
    if (st == SC_OK)
        st = sc_call_check_abandoned(c);
    if (st != SC_OK) {
        c->broken = 1;
        sc_call_abandon(c);
    }
    return st;
}
