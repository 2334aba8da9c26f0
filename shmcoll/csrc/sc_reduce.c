/* Kernel generation: every (dtype, op) gets first/mid/last loops written once as
 * macros, simple enough for the compiler to vectorise at -O3.  Integer arithmetic
 * wraps (the build passes -fwrapv), as numpy's does. */
#include <string.h>

#include "sc_reduce.h"
#include "shmcoll.h"

typedef _Float16 sc_f16;
typedef uint16_t sc_bf16;

static inline float bf16_load(sc_bf16 v)
{
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even, as ml_dtypes does; NaN stays a (quiet) NaN.  Both
 * candidates are computed and selected without a branch, so the loop vectorises. */
static inline sc_bf16 bf16_store(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t quiet_nan = (u >> 16) | 0x40u;
    return (sc_bf16)((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

/* float16 conversions are single instructions with F16C but a library call per
 * element without it, so the kernels are also compiled for x86-64-v3 (AVX2, F16C)
 * and the loader picks that clone on CPUs that have it. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define SC_KERNEL __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define SC_KERNEL
#endif

#define LOAD_SAME(v) (v)
#define LOAD_F16(v) ((float)(v))
#define STORE_F16(v) ((sc_f16)(v))
#define LOAD_BF16(v) bf16_load(v)
#define STORE_BF16(v) bf16_store(v)

/* NaN propagates through min/max, as np.minimum/np.maximum do. */
#define C_SUM(a, b) ((a) + (b))
#define C_PROD(a, b) ((a) * (b))
#define C_MIN(a, b) (((a) < (b) || (a) != (a)) ? (a) : (b))
#define C_MAX(a, b) (((a) > (b) || (a) != (a)) ? (a) : (b))
#define C_BAND(a, b) ((a) & (b))
#define C_BOR(a, b) ((a) | (b))
#define C_BXOR(a, b) ((a) ^ (b))

#define FIN_NONE(A, v, world) ((void)(world), (v))
#define FIN_DIV(A, v, world) ((A)((v) / (A)(world)))
/* Integer avg is floor division of the (wrapping) sum, like numpy's `//`. */
#define FIN_FLOORDIV(A, v, world) \
    ((A)((v) / (A)(world) - (A)(((v) % (A)(world) != 0) & ((v) < 0))))

#define DEFINE_FIRST(TN, T, A, LOAD)                                             \
    SC_KERNEL static void first_##TN(void *acc, const void *x, size_t n)                  \
    {                                                                            \
        A *restrict a = acc;                                                     \
        const T *restrict xs = x;                                                \
        for (size_t i = 0; i < n; i++)                                           \
            a[i] = (A)LOAD(xs[i]);                                               \
    }

#define DEFINE_OP(TN, T, A, LOAD, STORE, OPN, COMBINE, FINISH)                   \
    SC_KERNEL static void mid_##TN##_##OPN(void *acc_out, const void *acc_in, const void *x, size_t n) \
    {                                                                            \
        A *restrict o = acc_out;                                                 \
        const A *restrict in = acc_in;                                           \
        const T *restrict xs = x;                                                \
        for (size_t i = 0; i < n; i++) {                                         \
            A a = in[i], b = (A)LOAD(xs[i]);                                     \
            o[i] = (A)COMBINE(a, b);                                             \
        }                                                                        \
    }                                                                            \
    SC_KERNEL static void last_##TN##_##OPN(void *out, const void *acc_in, const void *x, size_t n, int world) \
    {                                                                            \
        T *o = out;                                                              \
        const A *restrict in = acc_in;                                           \
        const T *xs = x;                                                         \
        for (size_t i = 0; i < n; i++) {                                         \
            A a = in[i], b = (A)LOAD(xs[i]);                                     \
            A r = (A)COMBINE(a, b);                                              \
            o[i] = STORE(FINISH(A, r, world));                                   \
        }                                                                        \
    }

/* No restrict: combine runs in place (out == a or b), element by element. */
#define DEFINE_MERGE(TN, T, A, STORE, OPN, COMBINE, FINISH)                      \
    SC_KERNEL static void combine_##TN##_##OPN(void *out, const void *a, const void *b, size_t n) \
    {                                                                            \
        A *o = out;                                                              \
        const A *x = a, *y = b;                                                  \
        for (size_t i = 0; i < n; i++)                                           \
            o[i] = (A)COMBINE(x[i], y[i]);                                       \
    }                                                                            \
    SC_KERNEL static void finish_##TN##_##OPN(void *out, const void *acc, size_t n, int world) \
    {                                                                            \
        T *o = out;                                                              \
        const A *in = acc;                                                       \
        for (size_t i = 0; i < n; i++)                                           \
            o[i] = STORE(FINISH(A, in[i], world));                               \
    }

#define DEFINE_FLOAT_OPS(TN, T, A, LOAD, STORE)                                  \
    DEFINE_FIRST(TN, T, A, LOAD)                                                 \
    DEFINE_OP(TN, T, A, LOAD, STORE, sum, C_SUM, FIN_NONE)                       \
    DEFINE_MERGE(TN, T, A, STORE, sum, C_SUM, FIN_NONE)                         \
    DEFINE_OP(TN, T, A, LOAD, STORE, prod, C_PROD, FIN_NONE)                     \
    DEFINE_MERGE(TN, T, A, STORE, prod, C_PROD, FIN_NONE)                       \
    DEFINE_OP(TN, T, A, LOAD, STORE, min, C_MIN, FIN_NONE)                       \
    DEFINE_MERGE(TN, T, A, STORE, min, C_MIN, FIN_NONE)                         \
    DEFINE_OP(TN, T, A, LOAD, STORE, max, C_MAX, FIN_NONE)                       \
    DEFINE_MERGE(TN, T, A, STORE, max, C_MAX, FIN_NONE)                         \
    DEFINE_OP(TN, T, A, LOAD, STORE, avg, C_SUM, FIN_DIV)                        \
    DEFINE_MERGE(TN, T, A, STORE, avg, C_SUM, FIN_DIV)

#define DEFINE_INT_OPS(TN, T, AVG_FINISH)                                        \
    DEFINE_FIRST(TN, T, T, LOAD_SAME)                                            \
    DEFINE_OP(TN, T, T, LOAD_SAME, LOAD_SAME, sum, C_SUM, FIN_NONE)              \
    DEFINE_MERGE(TN, T, T, LOAD_SAME, sum, C_SUM, FIN_NONE)                     \
    DEFINE_OP(TN, T, T, LOAD_SAME, LOAD_SAME, prod, C_PROD, FIN_NONE)            \
    DEFINE_MERGE(TN, T, T, LOAD_SAME, prod, C_PROD, FIN_NONE)                   \
    DEFINE_OP(TN, T, T, LOAD_SAME, LOAD_SAME, min, C_MIN, FIN_NONE)              \
    DEFINE_MERGE(TN, T, T, LOAD_SAME, min, C_MIN, FIN_NONE)                     \
    DEFINE_OP(TN, T, T, LOAD_SAME, LOAD_SAME, max, C_MAX, FIN_NONE)              \
    DEFINE_MERGE(TN, T, T, LOAD_SAME, max, C_MAX, FIN_NONE)                     \
    DEFINE_OP(TN, T, T, LOAD_SAME, LOAD_SAME, avg, C_SUM, AVG_FINISH)            \
    DEFINE_MERGE(TN, T, T, LOAD_SAME, avg, C_SUM, AVG_FINISH)                   \
    DEFINE_OP(TN, T, T, LOAD_SAME, LOAD_SAME, band, C_BAND, FIN_NONE)            \
    DEFINE_MERGE(TN, T, T, LOAD_SAME, band, C_BAND, FIN_NONE)                   \
    DEFINE_OP(TN, T, T, LOAD_SAME, LOAD_SAME, bor, C_BOR, FIN_NONE)              \
    DEFINE_MERGE(TN, T, T, LOAD_SAME, bor, C_BOR, FIN_NONE)                     \
    DEFINE_OP(TN, T, T, LOAD_SAME, LOAD_SAME, bxor, C_BXOR, FIN_NONE)            \
    DEFINE_MERGE(TN, T, T, LOAD_SAME, bxor, C_BXOR, FIN_NONE)

DEFINE_INT_OPS(i8, int8_t, FIN_FLOORDIV)
DEFINE_INT_OPS(u8, uint8_t, FIN_DIV)
DEFINE_INT_OPS(i16, int16_t, FIN_FLOORDIV)
DEFINE_INT_OPS(u16, uint16_t, FIN_DIV)
DEFINE_INT_OPS(i32, int32_t, FIN_FLOORDIV)
DEFINE_INT_OPS(u32, uint32_t, FIN_DIV)
DEFINE_INT_OPS(i64, int64_t, FIN_FLOORDIV)
DEFINE_INT_OPS(u64, uint64_t, FIN_DIV)
DEFINE_FLOAT_OPS(f16, sc_f16, float, LOAD_F16, STORE_F16)
DEFINE_FLOAT_OPS(bf16, sc_bf16, float, LOAD_BF16, STORE_BF16)
DEFINE_FLOAT_OPS(f32, float, float, LOAD_SAME, LOAD_SAME)
DEFINE_FLOAT_OPS(f64, double, double, LOAD_SAME, LOAD_SAME)

#define INT_ROW(TN, T) { K(TN, T, T, sum), K(TN, T, T, prod), K(TN, T, T, min), K(TN, T, T, max), \
                         K(TN, T, T, avg), K(TN, T, T, band), K(TN, T, T, bor), K(TN, T, T, bxor) }
#define FLOAT_ROW(TN, T, A) { K(TN, T, A, sum), K(TN, T, A, prod), K(TN, T, A, min), K(TN, T, A, max), \
                              K(TN, T, A, avg), NONE, NONE, NONE }

#define K(TN, T, A, OPN) { first_##TN, mid_##TN##_##OPN, last_##TN##_##OPN, combine_##TN##_##OPN, \
                          finish_##TN##_##OPN, sizeof(T), sizeof(A),                    \
                          sizeof(T) != sizeof(A) || SC_##OPN == SC_avg }
#define NONE { 0 }
enum { SC_sum, SC_prod, SC_min, SC_max, SC_avg, SC_band, SC_bor, SC_bxor };

/* float16 with F16C: convert a block to float32 (8 lanes per instruction), run the
 * float32 kernel, convert back.  GCC converts _Float16 one element at a time even
 * with F16C, which leaves the element-wise kernels above compute-bound. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define F16C_BLOCK 512
#define SC_F16C __attribute__((target("f16c,avx")))

SC_F16C static void f16c_load(float *d, const uint16_t *s, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    for (; i < n; i++)
        d[i] = _cvtsh_ss(s[i]);
}

SC_F16C static void f16c_store(uint16_t *d, const float *s, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        d[i] = _cvtss_sh(s[i], _MM_FROUND_TO_NEAREST_INT);
}

static void f16c_first(void *acc, const void *x, size_t n) { f16c_load(acc, x, n); }

#define DEFINE_F16C_OP(OPN)                                                      \
    static void f16c_mid_##OPN(void *acc_out, const void *acc_in, const void *x, size_t n) \
    {                                                                            \
        float wide[F16C_BLOCK];                                                  \
        for (size_t i = 0; i < n; i += F16C_BLOCK) {                             \
            size_t m = n - i < F16C_BLOCK ? n - i : F16C_BLOCK;                  \
            f16c_load(wide, (const uint16_t *)x + i, m);                         \
            mid_f32_##OPN((float *)acc_out + i, (const float *)acc_in + i, wide, m); \
        }                                                                        \
    }                                                                            \
    static void f16c_last_##OPN(void *out, const void *acc_in, const void *x, size_t n, int world) \
    {                                                                            \
        float wide[F16C_BLOCK], res[F16C_BLOCK];                                 \
        for (size_t i = 0; i < n; i += F16C_BLOCK) {                             \
            size_t m = n - i < F16C_BLOCK ? n - i : F16C_BLOCK;                  \
            f16c_load(wide, (const uint16_t *)x + i, m);                         \
            last_f32_##OPN(res, (const float *)acc_in + i, wide, m, world);      \
            f16c_store((uint16_t *)out + i, res, m);                             \
        }                                                                        \
    }                                                                            \
    static void f16c_finish_##OPN(void *out, const void *acc, size_t n, int world) \
    {                                                                            \
        float res[F16C_BLOCK];                                                   \
        for (size_t i = 0; i < n; i += F16C_BLOCK) {                             \
            size_t m = n - i < F16C_BLOCK ? n - i : F16C_BLOCK;                  \
            finish_f32_##OPN(res, (const float *)acc + i, m, world);             \
            f16c_store((uint16_t *)out + i, res, m);                             \
        }                                                                        \
    }

DEFINE_F16C_OP(sum)
DEFINE_F16C_OP(prod)
DEFINE_F16C_OP(min)
DEFINE_F16C_OP(max)
DEFINE_F16C_OP(avg)

#define KF(OPN) { f16c_first, f16c_mid_##OPN, f16c_last_##OPN, combine_f16_##OPN, f16c_finish_##OPN, \
                  2, 4, 1 }
static const sc_kernels f16c_row[SC_NOPS] = { KF(sum), KF(prod), KF(min), KF(max), KF(avg),
                                              NONE, NONE, NONE };

static int have_f16c(void)
{
    static int cached = -1;
    if (cached < 0)
        cached = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
    return cached;
}
#else
static const sc_kernels f16c_row[SC_NOPS];
static int have_f16c(void) { return 0; }
#endif

static const sc_kernels table[SC_NDTYPES][SC_NOPS] = {
    [SC_INT8] = INT_ROW(i8, int8_t),       [SC_UINT8] = INT_ROW(u8, uint8_t),
    [SC_INT16] = INT_ROW(i16, int16_t),    [SC_UINT16] = INT_ROW(u16, uint16_t),
    [SC_INT32] = INT_ROW(i32, int32_t),    [SC_UINT32] = INT_ROW(u32, uint32_t),
    [SC_INT64] = INT_ROW(i64, int64_t),    [SC_UINT64] = INT_ROW(u64, uint64_t),
    [SC_FLOAT16] = FLOAT_ROW(f16, sc_f16, float),
    [SC_BFLOAT16] = FLOAT_ROW(bf16, sc_bf16, float),
    [SC_FLOAT32] = FLOAT_ROW(f32, float, float),
    [SC_FLOAT64] = FLOAT_ROW(f64, double, double),
};

const sc_kernels *sc_kernels_for(int dtype, int op)
{
    if (dtype < 0 || dtype >= SC_NDTYPES || op < 0 || op >= SC_NOPS)
        return NULL;
    const sc_kernels *k = dtype == SC_FLOAT16 && have_f16c() ? &f16c_row[op] : &table[dtype][op];
    return k->first ? k : NULL;
}

size_t sc_itemsize(int dtype)
{
    return (dtype >= 0 && dtype < SC_NDTYPES) ? table[dtype][SC_SUM].itemsize : 0;
}

int sc_op_supported(int dtype, int op) { return sc_kernels_for(dtype, op) != NULL; }
