/* bench_cuda_attention: attention throughput of the CUDA backend at the
 * Llama-3.2-1B shape (T 2048, 32 query heads, 8 kv heads, head dim 64,
 * causal), B = 1..4: the fp32 kernels of mt_backend_cuda()
 * (cuda_attention.cu, CUDA cores; at B = 1 only, they are slow) against the bf16 tensor-core kernels of
 * mt_backend_cuda_bf16(), both kinds (mt_cuda_attention_tc_select): the
 * mma.sync ones (cuda_attention_mma.cu, the default) and the WMMA ones
 * (cuda_attention_tc.cu), forward and backward.
 *
 * TFLOP/s use FlashAttention's count for causal attention: forward
 * 4 B nh T^2 hd / 2 (S = QK^T and PV over half the matrix), backward 2.5x
 * that (five products); work the kernels do beyond it (the diagonal
 * tiles whole, S and dP recomputed in both backward kernels) is not
 * counted, so these are effective rates.  MFU is against --peak (989
 * TFLOP/s, H100/H200 dense bf16).  It also prints the normwise difference
 * between the two tables' outputs at B = 1, a smoke check of the
 * tensor-core kernels at full size (expect a few 1e-3: P is rounded to
 * bf16; tests/backend/cuda/test_cuda_bf16 has the real checks), for both kinds.
 *
 *   bench/bench_cuda_attention [--iters N] [--peak TFLOPS] [--T N] [--hd 64|128]
 *
 * Exits 77 without a CUDA device. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mt_cuda.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *what)
{
    fprintf(stderr, "bench_cuda_attention: %s: %s (%s)\nhint: %s\n", what, mt_error_message(),
            mt_error_where(), mt_error_hint_text());
    exit(1);
}

static void *dalloc(mt_cuda_arena_t *a, size_t bytes)
{
    void *p = NULL;
    if (mt_cuda_arena_alloc(a, bytes, &p) != MT_OK)
        die("alloc");
    return p;
}

typedef struct {
    float *q, *k, *v, *dout, *out, *lse, *dq, *dk, *dv;
} bufs_t;

static void call_att(const mt_backend_t *be, const bufs_t *X, int64_t B, int64_t T, int64_t nh,
                     int64_t nkv, int64_t hd, int bwd)
{
    if (bwd)
        be->attention_backward(X->dq, X->dk, X->dv, X->dout, X->out, X->lse, X->q, X->k, X->v,
                               NULL, B, T, nh, nkv, hd);
    else
        be->attention_forward(X->out, X->lse, X->q, X->k, X->v, NULL, B, T, nh, nkv, hd);
}

/* seconds per call (forward, or backward when bwd), averaged over iters
 * after two warm-up calls */
static double time_att(const mt_backend_t *be, const bufs_t *X, int64_t B, int64_t T, int64_t nh,
                       int64_t nkv, int64_t hd, int bwd, int iters)
{
    for (int i = 0; i < 2; i++)
        call_att(be, X, B, T, nh, nkv, hd, bwd);
    if (mt_cuda_synchronize() != MT_OK)
        die("warm-up");
    const double t0 = now_s();
    for (int i = 0; i < iters; i++)
        call_att(be, X, B, T, nh, nkv, hd, bwd);
    if (mt_cuda_synchronize() != MT_OK)
        die("timing");
    return (now_s() - t0) / iters;
}

int main(int argc, char **argv)
{
    int iters = 10;
    double peak = 989.0;
    int64_t T = 2048, hd = 64;
    const int64_t nh = 32, nkv = 8, Bmax = 4;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--peak") && i + 1 < argc)
            peak = atof(argv[++i]);
        else if (!strcmp(argv[i], "--T") && i + 1 < argc)
            T = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--hd") && i + 1 < argc)
            hd = atoll(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--iters N] [--peak TFLOPS] [--T N] [--hd 64|128]\n",
                    argv[0]);
            return 2;
        }
    }
    if (mt_cuda_device_count() == 0) {
        printf("bench_cuda_attention: no CUDA device: skipping\n");
        return 77;
    }
    const size_t nq = (size_t)(Bmax * T * nh * hd), nk = (size_t)(Bmax * T * nkv * hd),
                 nl = (size_t)(Bmax * nh * T);
    mt_cuda_arena_t arena;
    const size_t bytes = (4 * nq + 4 * nk + nl) * sizeof(float) + ((size_t)256 << 20);
    if (mt_cuda_arena_init(&arena, "bench", bytes) != MT_OK ||
        mt_cuda_backend_init(&arena, (size_t)16 << 20) != MT_OK)
        die("device setup");
    bufs_t X;
    X.q = dalloc(&arena, nq * 4), X.dout = dalloc(&arena, nq * 4), X.out = dalloc(&arena, nq * 4);
    X.dq = dalloc(&arena, nq * 4), X.k = dalloc(&arena, nk * 4), X.v = dalloc(&arena, nk * 4);
    X.dk = dalloc(&arena, nk * 4), X.dv = dalloc(&arena, nk * 4), X.lse = dalloc(&arena, nl * 4);
    const mt_backend_t *f32 = mt_backend_cuda(), *tc = mt_backend_cuda_bf16();
    /* random bf16 values in [-1, 1): what the bf16 table is given */
    float *h = malloc(nq * sizeof(float));
    uint64_t s = 0x9e3779b97f4a7c15ull;
    float *dst[4] = {X.q, X.dout, X.k, X.v};
    for (int j = 0; j < 4; j++) {
        const size_t n = j < 2 ? nq : nk;
        for (size_t i = 0; i < n; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            h[i] = (float)((double)(s >> 11) * (2.0 / 9007199254740992.0) - 1.0);
        }
        f32->copy_to_device(dst[j], h, n * sizeof(float));
        tc->round_bf16(dst[j], (int64_t)n);
    }
    printf("bench_cuda_attention: causal GQA attention, T=%lld nh=%lld nkv=%lld hd=%lld, "
           "%d iters\n",
           (long long)T, (long long)nh, (long long)nkv, (long long)hd, iters);
    if (!mt_cuda_attention_tc_supported(hd))
        printf("note: the tensor-core kernels do not serve hd=%lld on this device: the bf16 "
               "table falls back to fp32\n",
               (long long)hd);

    /* smoke check at B = 1: the fp32 table's outputs against each kind */
    const size_t n1 = (size_t)(T * nh * hd);
    float *a = malloc(n1 * 4), *b = malloc(n1 * 4);
    f32->attention_forward(X.out, X.lse, X.q, X.k, X.v, NULL, 1, T, nh, nkv, hd);
    f32->copy_to_host(a, X.out, n1 * 4);
    double diff[2] = {0, 0}; /* [wmma, mma] */
    for (int kind = 0; kind < 2; kind++) {
        mt_cuda_attention_tc_select(kind);
        tc->attention_forward(X.out, X.lse, X.q, X.k, X.v, NULL, 1, T, nh, nkv, hd);
        tc->copy_to_host(b, X.out, n1 * 4);
        double md = 0.0, mr = 0.0;
        for (size_t i = 0; i < n1; i++) {
            const double d = fabs((double)a[i] - (double)b[i]);
            md = d > md || d != d ? d : md;
            mr = fabs((double)a[i]) > mr ? fabs((double)a[i]) : mr;
        }
        diff[kind] = mr > 0 ? md / mr : md;
        printf("tensor-core (%s) vs fp32 forward at B=1: normwise difference %.3g\n",
               kind ? "mma" : "wmma", diff[kind]);
    }
    free(a), free(b), free(h);

    printf("%-3s %-10s %-9s %10s %9s %7s\n", "B", "kernels", "pass", "ms", "TFLOP/s", "MFU%");
    static const char *names[3] = {"fp32", "bf16 wmma", "bf16 mma"};
    /* [fp32, wmma, mma][fwd, bwd] TFLOP/s, fp32 at B = 1, the others at Bmax */
    double res[3][2] = {{0, 0}, {0, 0}, {0, 0}};
    for (int64_t B = 1; B <= Bmax; B++) {
        const double ffwd = 2.0 * (double)B * nh * (double)T * (double)T * hd;
        for (int which = 0; which < 3; which++) {
            if (which == 0 && B > 1)
                continue; /* the CUDA-core reference at B = 1 only: it is slow */
            const mt_backend_t *be = which ? tc : f32;
            if (which)
                mt_cuda_attention_tc_select(which - 1);
            for (int bwd = 0; bwd < 2; bwd++) {
                const double t = time_att(be, &X, B, T, nh, nkv, hd, bwd, iters);
                const double tf = (bwd ? 2.5 * ffwd : ffwd) / t / 1e12;
                printf("%-3lld %-10s %-9s %10.3f %9.1f %7.1f\n", (long long)B, names[which],
                       bwd ? "backward" : "forward", t * 1e3, tf, 100.0 * tf / peak);
                if (B == Bmax || which == 0)
                    res[which][bwd] = tf;
            }
        }
    }
    mt_cuda_attention_tc_select(-1);
    printf("RESULT attn_fp32_fwd_tflops(B=1)=%.1f attn_fp32_bwd_tflops(B=1)=%.1f "
           "attn_wmma_fwd_tflops=%.1f "
           "attn_wmma_bwd_tflops=%.1f attn_mma_fwd_tflops=%.1f attn_mma_bwd_tflops=%.1f "
           "attn_vs_fp32_diff=%.2g/%.2g (B=%lld)\n",
           res[0][0], res[0][1], res[1][0], res[1][1], res[2][0], res[2][1], diff[0], diff[1],
           (long long)Bmax);
    mt_cuda_backend_free();
    mt_cuda_arena_free(&arena);
    return diff[0] <= 1.6e-2 && diff[1] <= 1.6e-2 ? 0 : 1;
}
