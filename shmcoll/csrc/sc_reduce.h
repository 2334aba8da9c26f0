/* Reduction kernels: one table entry per (dtype, op).
 *
 * A reduction passes partial results between ranks in an accumulator type: the
 * dtype itself, except float16/bfloat16 which accumulate in float32 so that P-1
 * roundings to 11 or 8 mantissa bits do not pile up.  Three kernels cover every
 * step of a pipelined reduction:
 *   first: acc  = widen(x)                          (the first hop)
 *   mid:   acc' = acc (+) widen(x)                  (every hop in between)
 *   last:  out  = narrow(finish(acc (+) widen(x)))  (the rank that completes it;
 *                                                    finish divides for avg)
 * `last` may write in place over x; acc never aliases x or out.  Schedules that
 * merge partial results (trees, recursive halving/doubling) also need
 *   combine: out  = a (+) b          (accumulators; out may alias a or b)
 *   finish:  out  = narrow(finish(acc))                  (out may alias acc) */
#ifndef SC_REDUCE_H
#define SC_REDUCE_H

#include <stddef.h>

typedef void (*sc_first_fn)(void *acc, const void *x, size_t n);
typedef void (*sc_mid_fn)(void *acc_out, const void *acc_in, const void *x, size_t n);
typedef void (*sc_last_fn)(void *out, const void *acc_in, const void *x, size_t n, int world);

typedef void (*sc_combine_fn)(void *out, const void *a, const void *b, size_t n);
typedef void (*sc_finish_fn)(void *out, const void *acc, size_t n, int world);

typedef struct sc_kernels {
    sc_first_fn first;
    sc_mid_fn mid;
    sc_last_fn last;
    sc_combine_fn combine;
    sc_finish_fn finish;
    size_t itemsize;
    size_t accsize;
    int finishes;     /* finish changes the bytes (narrowing or avg); else it is a copy */
} sc_kernels;

/* NULL when the op is not defined for the dtype (bitwise ops on floats). */
const sc_kernels *sc_kernels_for(int dtype, int op);
size_t sc_itemsize(int dtype);

#endif
