/* Mismatched calls.  A rank publishes {collective, count, dtype, op, root, algorithm,
 * where x and out lie in symmetric buffers} (and, not compared, the addresses of x and
 * out in its own process, for peers that read them with cross-memory attach, or an
 * inline call's part, which a peer's check copies out: sc_inline.c)
 * before it moves data, checks a peer's call the first time it is about to consume
 * something that peer sent in this call, and before it returns checks every peer it
 * has not checked yet.  So no rank returns success while any rank of the job made
 * another call, whatever the schedule's shape and whether or not the call moved data;
 * and no rank can run more than one call ahead of another.  A difference is recorded
 * once in the header and aborts the job with the mismatch reason, so every rank raises
 * the same MismatchError instead of hanging or reducing bytes of another call. */
#include <string.h>

#include "sc_internal.h"

void sc_call_begin(sc_comm *c, int collective, int64_t count, int dtype, int op, int root, int algo,
                   int64_t sym_x, int64_t sym_out, const void *x, const void *out,
                   const void *payload, size_t payload_bytes)
{
    c->call_seq++;
    c->call = (sc_call){ .field = { collective, count, dtype, op, root, algo, sym_x, sym_out } };
    c->call.where[SC_WHERE_X] = (uint64_t)(uintptr_t)x;
    c->call.where[SC_WHERE_OUT] = (uint64_t)(uintptr_t)out;
    if (payload_bytes)      /* (an inline call: x and out are not published then) */
        memcpy(c->call.payload, payload, payload_bytes);
    sc_call_slot *slot = &c->ranks[c->rank].calls[c->call_seq % SC_CALL_HISTORY];
    slot->call = c->call;
    sc_signal(&slot->seq, c->call_seq);
}

static void record(sc_comm *c, int field, int peer, int64_t mine, int64_t theirs)
{
    sc_mismatch *m = &c->hdr->mismatch;
    uint32_t unclaimed = 0;
    if (atomic_compare_exchange_strong(&m->claimed, &unclaimed, 1)) {
        m->field = field;
        m->rank_a = c->rank;
        m->rank_b = peer;
        m->value_a = mine;
        m->value_b = theirs;
        m->collective = c->call.field[SC_FIELD_COLLECTIVE];
        /* The release store publishes the complete record with the reason. */
        sc_signal(&c->hdr->abort, SC_ABORT_MISMATCH);
    } else {
        /* Another rank is writing the record: report it only once it is whole. */
        sc_wait_ge(c, &c->hdr->abort, SC_ABORT_MISMATCH, -1, "", NULL);
    }
}

static int mismatch(sc_comm *c, int field, int peer, int64_t mine, int64_t theirs)
{
    record(c, field, peer, mine, theirs);
    SC_BLAME(c)->peer = peer;
    SC_BLAME(c)->what = "checking the call of";
    return SC_EMISMATCH;
}

int sc_call_check(sc_comm *c, int peer)
{
    sc_call_slot *slot = &c->ranks[peer].calls[c->call_seq % SC_CALL_HISTORY];
    uint64_t seen;
    SC_TRY(sc_wait_ge(c, &slot->seq, c->call_seq, peer, "waiting for the call of", &seen));
    sc_call theirs = slot->call;
    /* A later call may overwrite the entry while we read it: the copy counts only if
     * the sequence number is still ours afterwards. */
    atomic_thread_fence(memory_order_acquire);
    uint64_t after = atomic_load_explicit(&slot->seq.value, memory_order_relaxed);
    if (seen != c->call_seq || after != seen)
        return mismatch(c, SC_FIELD_SEQUENCE, peer, (int64_t)c->call_seq, (int64_t)after);
    for (int f = 0; f < SC_CALL_FIELDS; f++)
        if (c->call.field[f] != theirs.field[f])
            return mismatch(c, f, peer, c->call.field[f], theirs.field[f]);
    if (c->call.field[SC_FIELD_ALGORITHM] == SC_ALGO_DIRECT_INLINE)   /* (theirs too) */
        memcpy(c->parts + (size_t)peer * SC_INLINE_BYTES, theirs.payload, SC_INLINE_BYTES);
    else if (c->peer_where) {   /* (read inside the sequence check: this call's addresses) */
        c->peer_where[2 * peer + SC_WHERE_X] = theirs.where[SC_WHERE_X];
        c->peer_where[2 * peer + SC_WHERE_OUT] = theirs.where[SC_WHERE_OUT];
    }
    return SC_OK;
}

int sc_call_check_once(sc_comm *c, int peer)
{
    if (c->recv[peer].checked != c->call_seq) {
        SC_TRY(sc_call_check(c, peer));
        c->recv[peer].checked = c->call_seq;
    }
    return SC_OK;
}

int sc_call_check_all(sc_comm *c)
{
    for (int i = 1; i < c->world; i++)
        SC_TRY(sc_call_check_once(c, (c->rank + i) % c->world));
    return SC_OK;
}

/* A call that failed on one rank after others had what they needed from it would
 * succeed on them, and the ranks would disagree on whether it happened.  A rank that
 * gives up records the call; a rank that finished it looks before returning.  (A rank
 * giving up after that look cannot be seen: its peers' results are whole then.) */
void sc_call_abandon(sc_comm *c)
{
    atomic_store_explicit(&c->ranks[c->rank].abandoned, c->call_seq, memory_order_release);
    sc_wake_peers(c);
}

int sc_call_check_abandoned(sc_comm *c)
{
    for (int i = 1; i < c->world; i++) {
        int peer = (c->rank + i) % c->world;
        if (atomic_load_explicit(&c->ranks[peer].abandoned, memory_order_acquire) == c->call_seq) {
            sc_abort_failed(c->hdr, peer);  /* (a rank that waits on us then names it too) */
            SC_BLAME(c)->peer = SC_BLAME(c)->waited = peer;
            SC_BLAME(c)->what = "finishing a call given up by";
            return SC_EPEERLOST;
        }
    }
    return SC_OK;
}

uint64_t sc_call_number(const sc_comm *c) { return c->call_seq; }

void sc_mismatch_info(const sc_comm *c, int64_t out[6])
{
    const sc_mismatch *m = &c->hdr->mismatch;
    out[0] = m->field, out[1] = m->rank_a, out[2] = m->rank_b;
    out[3] = m->value_a, out[4] = m->value_b, out[5] = m->collective;
}

int sc_ranks_missing(const sc_comm *c, int *out, int max)
{
    int n = 0;
    for (int r = 0; r < c->world && n < max; r++) {
        const sc_rank_block *rb = &c->ranks[r];
        if (r == c->rank)
            continue;
        if (c->call_seq == 0) {     /* still joining: who has not attached */
            if (atomic_load_explicit(&((sc_rank_block *)rb)->state, memory_order_acquire) == SC_RANK_EMPTY)
                out[n++] = r;
            continue;
        }
        uint64_t latest = 0;
        for (int i = 0; i < SC_CALL_HISTORY; i++) {
            uint64_t v = atomic_load_explicit(&((sc_call_slot *)&rb->calls[i])->seq.value,
                                              memory_order_acquire);
            latest = v > latest ? v : latest;
        }
        if (latest < c->call_seq)
            out[n++] = r;
    }
    return n;
}
