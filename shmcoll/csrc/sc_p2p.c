/* Point-to-point messages on the pair channels of the second table.
 *
 * A message is a frame header (tag, length, type code) at the start of its first
 * slot, its first bytes after it, then whole slots; sender and receiver cut it alike.
 * Operations advance without blocking: each step moves as many cuts as the channel
 * allows, and a group whose operations are all stuck waits on all of their flags at
 * once.  So a send and a receive in one group (sendrecv; a batch of isend/irecv on
 * the progress thread) never wait for each other, and two ranks exchanging large
 * messages both ways cannot deadlock.  On the progress thread an operation that
 * finished leaves the group at once, and its work completes then (sc_progress.c).
 *
 * A channel carries one message at a time: operations on one endpoint take it in
 * the order they were posted, each holding it from its first step to its last cut,
 * which keeps messages between two ranks in order (two sends, or two receives of
 * one tag, never overtake each other even when the second could move first).  A
 * receive meeting a message of another tag copies it into process memory (the
 * stash) and looks again; a receive always looks at the stash first, so messages of
 * one tag are received in the order they were sent. */
#include <stdlib.h>
#include <string.h>

#include "sc_internal.h"

#define MAX_GROUP 256

typedef struct frame {
    int64_t tag;
    uint64_t bytes;
    int64_t dtype;
} frame;

enum { IDLE = 0, MOVING, DRAINING, STASHING, DONE };

/* What a stuck operation waits for. */
typedef struct blocker {
    sc_flag *flag;
    uint64_t target;
    int peer;
    const char *what;
} blocker;

static size_t first_cut(const sc_comm *c, uint64_t bytes)
{
    return sc_min(bytes, c->slot_bytes - SC_P2P_FRAME_BYTES);
}

static char *slot_of(const sc_comm *c, const sc_endpoint *e)
{
    return e->slots + (e->seq % c->nslots) * c->slot_bytes;
}

static int send_ready(const sc_comm *c, sc_endpoint *e, blocker *b)
{
    if (e->seq - e->seen < c->nslots)
        return 1;
    e->seen = atomic_load_explicit(&e->ch->tail.value, memory_order_acquire);
    if (e->seq - e->seen < c->nslots)
        return 1;
    *b = (blocker){ &e->ch->tail, e->seq - c->nslots + 1, e->peer,
                    "waiting for a free slot in the message channel to" };
    return 0;
}

static int recv_ready(sc_endpoint *e, blocker *b)
{
    if (e->seen > e->seq)
        return 1;
    e->seen = atomic_load_explicit(&e->ch->head.value, memory_order_acquire);
    if (e->seen > e->seq)
        return 1;
    *b = (blocker){ &e->ch->head, e->seq + 1, e->peer, "waiting for a message from" };
    return 0;
}

static int step_send(sc_comm *c, sc_p2p_op *op, int *moved, blocker *b)
{
    sc_endpoint *e = &c->p2p_send[op->peer];
    if (e->owner && e->owner != op)
        return SC_OK;       /* an earlier send to this peer goes first */
    e->owner = op;
    if (!e->reserved)
        SC_TRY(sc_reserve_channel(c, e));
    const char *buf = op->buf;
    while (op->state != DONE && send_ready(c, e, b)) {
        char *slot = slot_of(c, e);
        size_t n;
        if (op->state == IDLE) {
            *(frame *)slot = (frame){ op->tag, op->bytes, op->dtype };
            n = first_cut(c, op->bytes);
            memcpy(slot + SC_P2P_FRAME_BYTES, buf, n);
            op->state = MOVING;
        } else {
            n = sc_min(op->bytes - op->done, c->slot_bytes);
            memcpy(slot, buf + op->done, n);
        }
        op->done += n;
        sc_send_commit(e);
        *moved = 1;
        if (op->done == op->bytes) {
            op->state = DONE;
            op->status = SC_OK;
            e->owner = NULL;
        }
    }
    return SC_OK;
}

static int tag_matches(int64_t wanted, int64_t tag) { return wanted == SC_ANY_TAG || wanted == tag; }

/* Records the message (tag, bytes, dtype) that matched the receive's tag; whether
 * it fits the receive (same length and type). */
static int matched(sc_p2p_op *op, int64_t tag, uint64_t bytes, int64_t dtype)
{
    op->got_tag = tag, op->got_bytes = bytes, op->got_dtype = dtype;
    return bytes == op->bytes && dtype == op->dtype;
}

/* Takes the first stashed message from op's peer that matches op's tag. */
static int take_stashed(sc_comm *c, sc_p2p_op *op)
{
    if (!c->stash)
        return 0;
    for (sc_stashed **at = &c->stash[op->peer]; *at; at = &(*at)->next) {
        sc_stashed *m = *at;
        if (!tag_matches(op->tag, m->tag))
            continue;
        int fits = matched(op, m->tag, m->bytes, m->dtype);
        if (fits)
            memcpy(op->buf, m->data, m->bytes);
        *at = m->next;
        free(m);
        op->state = DONE;
        op->status = fits ? SC_OK : SC_ETRUNCATE;
        return 1;
    }
    return 0;
}

static int stash_append(sc_comm *c, int peer, sc_stashed *m)
{
    if (!c->stash && !(c->stash = calloc((size_t)c->world, sizeof *c->stash)))
        return 0;
    sc_stashed **at = &c->stash[peer];
    while (*at)
        at = &(*at)->next;
    m->next = NULL;
    *at = m;
    return 1;
}

static int no_memory(sc_comm *c, int peer)
{
    SC_BLAME(c)->peer = peer;
    SC_BLAME(c)->waited = -1;
    SC_BLAME(c)->what = "keeping a message that arrived ahead of its receive, from";
    return SC_ENOMEM;
}

/* Reads the header in the current slot and decides where the message goes. */
static int start_message(sc_comm *c, sc_p2p_op *op, sc_endpoint *e, char **dst)
{
    frame f = *(const frame *)slot_of(c, e);
    op->done = 0;
    if (tag_matches(op->tag, f.tag)) {
        op->state = matched(op, f.tag, f.bytes, f.dtype) ? MOVING : DRAINING;
        *dst = op->state == MOVING ? op->buf : NULL;
        return SC_OK;
    }
    sc_stashed *m = malloc(sizeof *m + f.bytes);
    if (!m)
        return no_memory(c, op->peer);
    m->tag = f.tag, m->bytes = f.bytes, m->dtype = f.dtype;
    op->stashing = m;
    op->got_bytes = f.bytes;
    op->state = STASHING;
    *dst = m->data;
    return SC_OK;
}

static int end_message(sc_comm *c, sc_p2p_op *op, sc_endpoint *e)
{
    if (op->state != STASHING) {
        op->status = op->state == MOVING ? SC_OK : SC_ETRUNCATE;
        op->state = DONE;
        e->owner = NULL;
        return SC_OK;
    }
    op->state = IDLE;
    if (!stash_append(c, op->peer, op->stashing)) {
        free(op->stashing);
        return no_memory(c, op->peer);
    }
    op->stashing = NULL;
    return SC_OK;
}

static int step_recv(sc_comm *c, sc_p2p_op *op, int *moved, blocker *b)
{
    sc_endpoint *e = &c->p2p_recv[op->peer];
    while (op->state != DONE) {
        if (op->state == IDLE && take_stashed(c, op)) {
            if (e->owner == op)
                e->owner = NULL;
            *moved = 1;
            break;
        }
        if (e->owner && e->owner != op)
            return SC_OK;       /* an earlier receive from this peer goes first */
        e->owner = op;          /* (in the order the receives were posted) */
        if (!recv_ready(e, b))
            return SC_OK;
        char *dst = NULL, *slot = slot_of(c, e);
        size_t n, at = op->done;
        if (op->state == IDLE) {
            SC_TRY(start_message(c, op, e, &dst));
            slot += SC_P2P_FRAME_BYTES;
            n = first_cut(c, op->got_bytes);
            at = 0;
        } else {
            dst = op->state == MOVING ? op->buf : op->state == STASHING ?
                  ((sc_stashed *)op->stashing)->data : NULL;
            n = sc_min(op->got_bytes - op->done, c->slot_bytes);
        }
        if (dst)
            memcpy(dst + at, slot, n);
        op->done += n;
        sc_recv_release(e);
        *moved = 1;
        if (op->done == op->got_bytes)
            SC_TRY(end_message(c, op, e));
    }
    return SC_OK;
}

static int bad_op(const sc_comm *c, const sc_p2p_op *op)
{
    return op->peer < 0 || op->peer >= c->world ||
           (op->kind != SC_P2P_SEND && op->kind != SC_P2P_RECV) ||
           (op->tag < 0 && !(op->kind == SC_P2P_RECV && op->tag == SC_ANY_TAG));
}

static void start_ops(sc_p2p_op *const *ops, int from, int n)
{
    for (int i = from; i < n; i++) {
        ops[i]->state = IDLE;
        ops[i]->done = 0;
        ops[i]->status = -1;     /* not finished */
        ops[i]->stashing = NULL;
        ops[i]->got_tag = ops[i]->got_dtype = -1;
        ops[i]->got_bytes = 0;
    }
}

/* A failure ends the group.  The channels stay usable when it only stopped a wait
 * (a timeout, a signal) before any operation got halfway through a message: nothing
 * was half written or half read, so a later call may wait again. */
static int fail(sc_comm *c, sc_p2p_op *const *ops, int n, int st)
{
    int halfway = 0;
    for (int i = 0; i < n; i++) {
        sc_endpoint *e = ops[i]->kind == SC_P2P_SEND ? &c->p2p_send[ops[i]->peer]
                                                     : &c->p2p_recv[ops[i]->peer];
        if (e->owner == ops[i])
            e->owner = NULL;    /* the op may be gone once we return */
        halfway = halfway || (ops[i]->state != IDLE && ops[i]->state != DONE);
        free(ops[i]->stashing);
        ops[i]->stashing = NULL;
    }
    if (halfway || (st != SC_ETIMEDOUT && st != SC_EINTR))
        c->p2p_broken = 1;  /* the collectives' channels are untouched */
    return st;
}

/* Drops the finished ops from ops[0..n), keeping the others in the order they were
 * posted (which decides who takes a channel next); returns how many are left. */
static int drop_finished(sc_p2p_op **ops, int n)
{
    int kept = 0;
    for (int i = 0; i < n; i++)
        if (ops[i]->state != DONE)
            ops[kept++] = ops[i];
    return kept;
}

static int run_group(sc_comm *c, sc_p2p_op **ops, int n, int cap, sc_p2p_more more,
                     sc_p2p_finished finished, void *ctx)
{
    start_ops(ops, 0, n);   /* first: an op refused below is cut off, never a success */
    if (c->broken || c->p2p_broken)
        return SC_EBROKEN;
    if (n > MAX_GROUP)
        return SC_EINVAL;
    for (int i = 0; i < n; i++)
        if (bad_op(c, ops[i]))
            return SC_EINVAL;
    sc_flag *flags[MAX_GROUP];
    uint64_t targets[MAX_GROUP];
    int peers[MAX_GROUP];
    for (;;) {
        int pending = 0, moved = 0, nb = 0, ended = 0;
        const char *what = "";
        for (int i = 0; i < n; i++) {
            sc_p2p_op *op = ops[i];
            blocker b = { NULL, 0, -1, "" };
            if (op->state == DONE)
                continue;
            int st = op->kind == SC_P2P_SEND ? step_send(c, op, &moved, &b)
                                             : step_recv(c, op, &moved, &b);
            if (st != SC_OK)
                return fail(c, ops, n, st);
            if (op->state == DONE) {
                ended = 1;
                continue;
            }
            pending++;
            if (b.flag) {
                if (!nb)
                    what = b.what;
                flags[nb] = b.flag, targets[nb] = b.target, peers[nb] = b.peer;
                nb++;
            }
        }
        if (!pending)
            return SC_OK;
        if (ended && finished) {    /* their works complete now, not with the group */
            n = drop_finished(ops, n);
            finished(ctx);
        }
        if (moved)
            continue;
        if (more) {     /* operations queued since: they may be what unblocks us */
            sc_flag *wake = NULL;
            uint64_t target = 0;
            int grown = more(ctx, ops, n, cap > MAX_GROUP ? MAX_GROUP : cap, &wake, &target);
            if (grown > n) {      /* (checked by the caller, as every queued op) */
                start_ops(ops, n, grown);
                n = grown;
                continue;
            }
            if (wake && nb < MAX_GROUP) {
                flags[nb] = wake, targets[nb] = target, peers[nb] = -1;
                nb++;
            }
        }
        int waited;
        int st = sc_wait_any(c, flags, targets, peers, nb, what, &waited);
        if (st != SC_OK)
            return fail(c, ops, n, st);
    }
}

_Thread_local int sc_in_p2p;

int sc_p2p_run(sc_comm *c, sc_p2p_op **ops, int n, int cap, sc_p2p_more more,
               sc_p2p_finished finished, void *ctx)
{
    sc_in_p2p = 1;
    int st = run_group(c, ops, n, cap, more, finished, ctx);
    sc_in_p2p = 0;
    return st;
}

int sc_p2p(sc_comm *c, sc_p2p_op *const *ops, int n)
{
    return sc_p2p_run(c, (sc_p2p_op **)ops, n, n, NULL, NULL, NULL);
}

int64_t sc_p2p_self_room(const sc_comm *c)
{
    const sc_endpoint *e = &c->p2p_send[c->rank];
    uint64_t tail = atomic_load_explicit(&e->ch->tail.value, memory_order_acquire);
    uint64_t free_slots = c->nslots - (e->seq - tail);
    return free_slots ? (int64_t)(free_slots * c->slot_bytes - SC_P2P_FRAME_BYTES) : -1;
}

void sc_p2p_free_stash(sc_comm *c)
{
    if (!c->stash)
        return;
    for (int q = 0; q < c->world; q++)
        while (c->stash[q]) {
            sc_stashed *m = c->stash[q];
            c->stash[q] = m->next;
            free(m);
        }
    free(c->stash);
    c->stash = NULL;
}
