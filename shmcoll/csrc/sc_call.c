/* Mismatched calls.  A rank publishes {collective, count, dtype, op, root, algorithm}
 * before it moves data, and checks a peer's call the first time it is about to
 * consume something that peer sent in this call.  A difference is recorded once in
 * the header and aborts the job with the mismatch reason, so every rank raises the
 * same MismatchError instead of hanging or reducing bytes of another call. */
#include "sc_internal.h"

void sc_call_begin(sc_comm *c, int collective, int64_t count, int dtype, int op, int root, int algo)
{
    c->call_seq++;
    c->call = (sc_call){ { collective, count, dtype, op, root, algo } };
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

int sc_call_check(sc_comm *c, int peer)
{
    sc_call_slot *slot = &c->ranks[peer].calls[c->call_seq % SC_CALL_HISTORY];
    uint64_t seen;
    int st = sc_wait_ge(c, &slot->seq, c->call_seq, peer, "waiting for the call of", &seen);
    if (st != SC_OK)
        return st;
    if (seen != c->call_seq)
        return SC_OK;   /* the peer ran calls ahead that moved no data; nothing to check */
    for (int f = 0; f < SC_CALL_FIELDS; f++) {
        int64_t mine = c->call.field[f], theirs = slot->call.field[f];
        if (mine != theirs) {
            record(c, f, peer, mine, theirs);
            c->err_peer = peer;
            c->err_what = "checking the call of";
            return SC_EMISMATCH;
        }
    }
    return SC_OK;
}

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
        for (int k = 0; k < SC_CALL_HISTORY; k++) {
            uint64_t v = atomic_load_explicit(&((sc_call_slot *)&rb->calls[k])->seq.value,
                                              memory_order_acquire);
            latest = v > latest ? v : latest;
        }
        if (latest < c->call_seq)
            out[n++] = r;
    }
    return n;
}
