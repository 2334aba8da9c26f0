// Device kernels of the CUDA IPC path (compiled at first use by CuPy's NVRTC).
//
// Self-contained on purpose: no CUDA headers, so the same source compiles under
// NVRTC, nvcc and the tests' compile check.  float16/bfloat16 travel as their bit
// patterns and are widened to float32 for every reduction (one rounding at the end).
//
// Synchronisation: every rank owns a flags array flags[kind][src] (uint64, zeroed at
// setup).  A signal stores a per-pair sequence number into the peer's word for us
// with a system-scope release; a wait spins with system-scope acquires on our own
// words until each reaches its target, or until the deadline, when it records the
// peer in the mapped host word `status` and gives up (the host raises TimeoutError).
// Sequence numbers only grow, so no flag is ever reset.

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;

__device__ __forceinline__ u64 ld_acquire_sys(const u64 *p)
{
    u64 v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void st_release_sys(u64 *p, u64 v)
{
    asm volatile("st.release.sys.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ u64 global_ns()
{
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Signal then wait: thread t < world handles peer t.  peer < 0: every peer.
// signal_value / wait_value 0: that half is skipped.
extern "C" __global__ void sc_sync(u64 *const *flag_table, int me, int world, int kind, int peer,
                                   u64 signal_value, u64 wait_value, u64 timeout_ns,
                                   volatile int *status)
{
    int t = threadIdx.x;
    bool mine = t < world && t != me && (peer < 0 || t == peer);
    if (mine && signal_value) {
        __threadfence_system();
        st_release_sys(flag_table[t] + (u64)kind * world + me, signal_value);
    }
    if (mine && wait_value) {
        const u64 *word = flag_table[me] + (u64)kind * world + t;
        u64 start = global_ns();
        while (ld_acquire_sys(word) < wait_value) {
            if (*status)
                break;                              // another wait already gave up
            if (global_ns() - start > timeout_ns) {
                atomicCAS((int *)status, 0, t + 1);
                break;
            }
            __nanosleep(200);
        }
    }
}

// ---- element types: storage type, accumulation type, load and store -----------

template <typename T> struct Elem {
    typedef T acc;
    static __device__ __forceinline__ acc load(const T *p, u64 i) { return p[i]; }
    static __device__ __forceinline__ void store(T *p, u64 i, acc v) { p[i] = v; }
    static const bool is_float = false;
};
template <> struct Elem<float> {
    typedef float acc;
    static __device__ __forceinline__ float load(const float *p, u64 i) { return p[i]; }
    static __device__ __forceinline__ void store(float *p, u64 i, float v) { p[i] = v; }
    static const bool is_float = true;
};
template <> struct Elem<double> {
    typedef double acc;
    static __device__ __forceinline__ double load(const double *p, u64 i) { return p[i]; }
    static __device__ __forceinline__ void store(double *p, u64 i, double v) { p[i] = v; }
    static const bool is_float = true;
};

struct half_bits { u16 b; };       // float16 storage
struct bf16_bits { u16 b; };       // bfloat16 storage

template <> struct Elem<half_bits> {
    typedef float acc;
    static __device__ __forceinline__ float load(const half_bits *p, u64 i)
    {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(p[i].b));
        return f;
    }
    static __device__ __forceinline__ void store(half_bits *p, u64 i, float v)
    {
        u16 b;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(b) : "f"(v));
        p[i].b = b;
    }
    static const bool is_float = true;
};
template <> struct Elem<bf16_bits> {
    typedef float acc;
    static __device__ __forceinline__ float load(const bf16_bits *p, u64 i)
    {
        return __uint_as_float((u32)p[i].b << 16);
    }
    static __device__ __forceinline__ void store(bf16_bits *p, u64 i, float v)
    {
        u32 u = __float_as_uint(v);
        if ((u & 0x7fffffffu) > 0x7f800000u)            // NaN stays a quiet NaN
            p[i].b = (u16)((u >> 16) | 0x40);
        else                                            // round to nearest even
            p[i].b = (u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    static const bool is_float = true;
};

// ---- operators on the accumulation type ---------------------------------------

template <typename A> __device__ __forceinline__ bool is_nan(A v) { return v != v; }

// Integer sums and products wrap like numpy: computed on the unsigned twin.
template <typename A> struct Unsigned { typedef A type; };
template <> struct Unsigned<signed char> { typedef unsigned char type; };
template <> struct Unsigned<short> { typedef unsigned short type; };
template <> struct Unsigned<int> { typedef unsigned int type; };
template <> struct Unsigned<long long> { typedef unsigned long long type; };

struct Sum {
    template <typename A> static __device__ __forceinline__ A apply(A a, A b)
    {
        typedef typename Unsigned<A>::type U;
        return (A)((U)a + (U)b);
    }
};
template <> __device__ __forceinline__ float Sum::apply<float>(float a, float b) { return a + b; }
template <> __device__ __forceinline__ double Sum::apply<double>(double a, double b) { return a + b; }

struct Prod {
    template <typename A> static __device__ __forceinline__ A apply(A a, A b)
    {
        typedef typename Unsigned<A>::type U;
        return (A)((U)a * (U)b);
    }
};
template <> __device__ __forceinline__ float Prod::apply<float>(float a, float b) { return a * b; }
template <> __device__ __forceinline__ double Prod::apply<double>(double a, double b) { return a * b; }

struct Min {    // NaN wins, as in numpy.minimum
    template <typename A> static __device__ __forceinline__ A apply(A a, A b)
    {
        return is_nan(a) ? a : is_nan(b) ? b : (b < a ? b : a);
    }
};
struct Max {
    template <typename A> static __device__ __forceinline__ A apply(A a, A b)
    {
        return is_nan(a) ? a : is_nan(b) ? b : (b > a ? b : a);
    }
};
struct BAnd { template <typename A> static __device__ __forceinline__ A apply(A a, A b) { return a & b; } };
struct BOr  { template <typename A> static __device__ __forceinline__ A apply(A a, A b) { return a | b; } };
struct BXor { template <typename A> static __device__ __forceinline__ A apply(A a, A b) { return a ^ b; } };
struct Avg : Sum {};

// What the last step does to the accumulated value: nothing, except for avg
// (the mean for floats; numpy's floor division of the wrapped sum for integers).
template <typename Op, typename A> __device__ __forceinline__ A finish(A v, int world) { return v; }
template <typename A> __device__ __forceinline__ A floor_div(A v, A w)
{
    A q = v / w;
    return (v % w != 0 && ((v < 0) != (w < 0))) ? (A)(q - 1) : q;
}
template <> __device__ __forceinline__ float finish<Avg, float>(float v, int world) { return v / world; }
template <> __device__ __forceinline__ double finish<Avg, double>(double v, int world) { return v / world; }
template <> __device__ __forceinline__ signed char finish<Avg, signed char>(signed char v, int w) { return floor_div<signed char>(v, (signed char)w); }
template <> __device__ __forceinline__ unsigned char finish<Avg, unsigned char>(unsigned char v, int w) { return v / (unsigned char)w; }
template <> __device__ __forceinline__ short finish<Avg, short>(short v, int w) { return floor_div<short>(v, (short)w); }
template <> __device__ __forceinline__ unsigned short finish<Avg, unsigned short>(unsigned short v, int w) { return v / (unsigned short)w; }
template <> __device__ __forceinline__ int finish<Avg, int>(int v, int w) { return floor_div<int>(v, w); }
template <> __device__ __forceinline__ unsigned int finish<Avg, unsigned int>(unsigned int v, int w) { return v / (unsigned int)w; }
template <> __device__ __forceinline__ long long finish<Avg, long long>(long long v, int w) { return floor_div<long long>(v, (long long)w); }
template <> __device__ __forceinline__ unsigned long long finish<Avg, unsigned long long>(unsigned long long v, int w) { return v / (unsigned long long)w; }

// ---- reductions ------------------------------------------------------------------

// out[i] = x_0[i] (+) x_1[i] (+) ... (+) x_{n-1}[i], x_r = table[r] + offset bytes, in
// rank order on every rank (so every rank gets the same bits).
template <typename T, typename Op>
__global__ void reduce_table(T *out, const char *const *table, int nsrc, u64 offset, u64 count,
                             int world)
{
    typedef Elem<T> E;
    __shared__ const T *src[64];
    for (int r = threadIdx.x; r < nsrc && r < 64; r += blockDim.x)
        src[r] = (const T *)(table[r] + offset);
    __syncthreads();
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (u64)gridDim.x * blockDim.x) {
        typename E::acc acc = E::load(src[0], i);
        for (int r = 1; r < nsrc; ++r)
            acc = Op::apply(acc, E::load(src[r], i));
        E::store(out, i, finish<Op>(acc, world));
    }
}

// One ring step: out = a (+) b, where a is the partial received (storage type T or
// the accumulation type) and b this rank's block.  `last`: write T and finish.
template <typename T, typename Op, bool PartialIsAcc, bool Last>
__global__ void ring_combine(void *out, const void *a, const T *b, u64 count, int world)
{
    typedef Elem<T> E;
    typedef typename E::acc A;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (u64)gridDim.x * blockDim.x) {
        A left = PartialIsAcc ? ((const A *)a)[i] : E::load((const T *)a, i);
        A v = Op::apply(left, E::load(b, i));
        if (Last)
            E::store((T *)out, i, finish<Op>(v, world));
        else
            ((A *)out)[i] = v;
    }
}
