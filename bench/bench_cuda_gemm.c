/* bench_cuda_gemm: bf16 GEMM throughput of the CUDA backend (cuBLASLt,
 * fp32 accumulation, mt_cuda_matmul_bf16) at the GEMM shapes of one
 * training step of a Llama-3.2-1B-sized model (d 2048, ffn 8192, 32 heads
 * of 64, 8 kv heads, vocabulary 128256, 16 layers), and what that
 * implies: TFLOP/s per GEMM, the step's GEMM time, and the MFU of the
 * GEMM path against 989 TFLOP/s (H100/H200 dense bf16).  Then the same
 * step through the GEMM the trainer's bf16 table uses today: float32
 * storage holding bf16 values, CUBLAS_COMPUTE_32F_FAST_16BF
 * (mt_backend_cuda_bf16()->matmul): the gap between the two is what bf16
 * storage would win on the GEMMs (doc/gpu.md).  Third, the middle way a
 * float32-storage trainer could take: convert each activation operand to
 * bf16 (mt_cuda_f32_to_bf16) and run the bf16 cuBLASLt GEMM with an fp32
 * result (mt_cuda_matmul_bf16_f32out), the weights already bf16 (as
 * AdamW could write them); the forward converts x and the dgrad dy, and
 * the wgrad reuses both, so the conversions' time is in the figures.
 * It measures GEMMs only:
 * attention, norms and the optimizer are not in it, so the MFU of a real
 * step is lower.
 *
 *   bench/bench_cuda_gemm [--tokens N] [--iters N] [--peak TFLOPS]
 *
 * Exits 77 without a CUDA device. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mt_cuda.h"

typedef struct {
    const char *name;
    int64_t n, k; /* weight [n, k] (nn.Linear layout): y[M,n] = x[M,k] W^T */
    int per_step; /* times per step (layers) */
} shape_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *what)
{
    fprintf(stderr, "bench_cuda_gemm: %s: %s (%s)\nhint: %s\n", what, mt_error_message(),
            mt_error_where(), mt_error_hint_text());
    exit(1);
}

enum { BF16, FP32, CONVERT, NMODES };

/* The third mode's bf16 copy of a float32 operand: its conversion runs
 * first when src is set (an activation), never for a weight (NULL). */
typedef struct {
    uint16_t *bf;
    const float *src;
    int64_t n;
} conv_t;

/* one GEMM c = op(a) op(b): bf16 operands, float32 ones (FP32), or float32
 * activations converted first (CONVERT: ca, cb) */
static void gemm(int mode, void *c, const void *a, const void *b, int64_t m, int64_t n,
                 int64_t k, int ta, int tb, const conv_t *ca, const conv_t *cb)
{
    if (mode == FP32) {
        mt_backend_cuda_bf16()->matmul(c, a, b, m, n, k, ta, tb, 0.0f);
    } else if (mode == BF16) {
        mt_cuda_matmul_bf16(c, a, b, m, n, k, ta, tb, 0.0f);
    } else {
        if (ca->src)
            mt_cuda_f32_to_bf16(ca->bf, ca->src, ca->n);
        if (cb->src)
            mt_cuda_f32_to_bf16(cb->bf, cb->src, cb->n);
        mt_cuda_matmul_bf16_f32out(c, ca->bf, cb->bf, m, n, k, ta, tb, 0.0f);
    }
}

/* seconds per call of y = op(a) op(b), averaged over iters after a warm-up */
static double time_gemm(int mode, void *c, const void *a, const void *b, int64_t m, int64_t n,
                        int64_t k, int ta, int tb, const conv_t *ca, const conv_t *cb,
                        int iters)
{
    for (int i = 0; i < 3; i++)
        gemm(mode, c, a, b, m, n, k, ta, tb, ca, cb);
    if (mt_cuda_synchronize() != MT_OK)
        die("warm-up");
    const double t0 = now_s();
    for (int i = 0; i < iters; i++)
        gemm(mode, c, a, b, m, n, k, ta, tb, ca, cb);
    if (mt_cuda_synchronize() != MT_OK)
        die("timing");
    return (now_s() - t0) / iters;
}

/* seconds per call of the LM head's weight gradient as the trainer runs it
 * (model.c head_pass): dW [V, H] float32 += dlogits^T x over a chunk of c
 * rows, dlogits [c, V] and x [c, H] bf16 */
static double time_head_dw(float *dw, const uint16_t *dl, const uint16_t *x, int64_t V,
                           int64_t H, int64_t c, int iters)
{
    for (int i = 0; i < 3; i++)
        mt_cuda_matmul_bf16_f32out(dw, dl, x, V, H, c, 1, 0, 1.0f);
    if (mt_cuda_synchronize() != MT_OK)
        die("warm-up");
    const double t0 = now_s();
    for (int i = 0; i < iters; i++)
        mt_cuda_matmul_bf16_f32out(dw, dl, x, V, H, c, 1, 0, 1.0f);
    if (mt_cuda_synchronize() != MT_OK)
        die("timing");
    return (now_s() - t0) / iters;
}

int main(int argc, char **argv)
{
    int64_t M = 8192; /* tokens per micro-batch: 4 x 2048 */
    int iters = 20;
    double peak = 989.0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
            M = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--peak") && i + 1 < argc)
            peak = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--tokens N] [--iters N] [--peak TFLOPS]\n", argv[0]);
            return 2;
        }
    }
    if (mt_cuda_device_count() == 0) {
        printf("bench_cuda_gemm: no CUDA device: skipping\n");
        return 77;
    }
    const int L = 16;
    const shape_t shapes[] = {
        {"q_proj / o_proj", 2048, 2048, 2 * L},
        {"k_proj / v_proj", 512, 2048, 2 * L},
        {"gate / up", 8192, 2048, 2 * L},
        {"down", 2048, 8192, L},
        {"lm_head", 128256, 2048, 1},
    };
    const int nshapes = (int)(sizeof shapes / sizeof shapes[0]);
    size_t maxw = 0, maxy = 0, maxx = 0;
    for (int s = 0; s < nshapes; s++) {
        const size_t w = (size_t)(shapes[s].n * shapes[s].k), y = (size_t)(M * shapes[s].n),
                     x = (size_t)(M * shapes[s].k);
        maxw = w > maxw ? w : maxw;
        maxy = y > maxy ? y : maxy;
        maxx = x > maxx ? x : maxx;
    }
    mt_cuda_arena_t arena; /* buffers of float32 size; bf16 uses their first halves */
    const size_t bytes = 4 * (maxw * 2 + maxy + maxx * 2) + 2 * (maxw + maxy + maxx) +
                         ((size_t)256 << 20);
    if (mt_cuda_arena_init(&arena, "bench", bytes) != MT_OK ||
        mt_cuda_backend_init(&arena, (size_t)16 << 20) != MT_OK)
        die("device setup");
    void *W, *X, *Y, *dW, *dX, *p;
    if (mt_cuda_arena_alloc(&arena, maxw * 4, &p) != MT_OK) die("alloc");
    W = p;
    if (mt_cuda_arena_alloc(&arena, maxw * 4, &p) != MT_OK) die("alloc");
    dW = p;
    if (mt_cuda_arena_alloc(&arena, maxy * 4, &p) != MT_OK) die("alloc");
    Y = p;
    if (mt_cuda_arena_alloc(&arena, maxx * 4, &p) != MT_OK) die("alloc");
    X = p;
    if (mt_cuda_arena_alloc(&arena, maxx * 4, &p) != MT_OK) die("alloc");
    dX = p;
    void *Wb, *Yb, *Xb; /* the third mode's bf16 operands */
    if (mt_cuda_arena_alloc(&arena, maxw * 2, &Wb) != MT_OK ||
        mt_cuda_arena_alloc(&arena, maxy * 2, &Yb) != MT_OK ||
        mt_cuda_arena_alloc(&arena, maxx * 2, &Xb) != MT_OK)
        die("alloc");
    const mt_backend_t *be = mt_backend_cuda();
    /* small values so nothing overflows: bf16 0x3c00 = 0.0078125, the same
     * in float32 */
    size_t most = maxy > maxw ? maxy : maxw;
    most = maxx > most ? maxx : most;
    uint16_t *fill = malloc(most * 2);
    float *fill32 = malloc(most * 4);
    for (size_t i = 0; i < most; i++)
        fill[i] = 0x3c00, fill32[i] = 0.0078125f;

    static const char *const title[NMODES] = {
        "bf16 cuBLASLt GEMMs",
        "float32 storage, CUBLAS_COMPUTE_32F_FAST_16BF (the trainer's bf16 table)",
        "float32 storage, activations converted to bf16, bf16 cuBLASLt GEMMs, fp32 results"};
    double tflops[NMODES] = {0}, step_ms[NMODES] = {0}, tok_s[NMODES] = {0};
    for (int mode = 0; mode < NMODES; mode++) {
        size_t el = mode == BF16 ? 2 : 4;
        const void *src = mode == BF16 ? (const void *)fill : (const void *)fill32;
        be->copy_to_device(W, src, maxw * el);
        be->copy_to_device(Y, src, maxy * el);
        be->copy_to_device(X, src, maxx * el);
        be->copy_to_device(Wb, fill, maxw * 2);
        printf("bench_cuda_gemm: %s, fp32 accumulation, M = %lld tokens, %d iters\n", title[mode],
               (long long)M, iters);
        printf("%-18s %-9s %8s %8s %8s %10s %9s\n", "gemm", "pass", "M", "N", "K", "ms",
               "TFLOP/s");
        double step_flop = 0.0, step_s = 0.0;
        for (int s = 0; s < nshapes; s++) {
            const int64_t n = shapes[s].n, k = shapes[s].k;
            /* forward y = x W^T; backward dx = dy W, dW = dy^T x (CONVERT:
             * x converted in the forward, dy in the dgrad, the wgrad
             * reusing both; W bf16 throughout) */
            const conv_t cx = {Xb, X, M * k}, cy = {Yb, Y, M * n}, cw = {Wb, NULL, n * k};
            const conv_t kx = {Xb, NULL, M * k}, ky = {Yb, NULL, M * n};
            const double tf = time_gemm(mode, Y, X, W, M, n, k, 0, 1, &cx, &cw, iters);
            const double tdx = time_gemm(mode, dX, Y, W, M, k, n, 0, 0, &cy, &cw, iters);
            const double tdw = time_gemm(mode, dW, Y, X, n, k, M, 1, 0, &ky, &kx, iters);
            const double flop = 2.0 * (double)M * (double)n * (double)k;
            const char *pass[3] = {"forward", "dgrad", "wgrad"};
            const double t[3] = {tf, tdx, tdw};
            for (int j = 0; j < 3; j++)
                printf("%-18s %-9s %8lld %8lld %8lld %10.3f %9.1f\n", j ? "" : shapes[s].name,
                       pass[j], (long long)(j == 2 ? n : M), (long long)(j == 0 ? n : k),
                       (long long)(j == 2 ? M : (j == 1 ? n : k)), t[j] * 1e3,
                       flop / t[j] / 1e12);
            step_flop += 3.0 * flop * shapes[s].per_step;
            step_s += (tf + tdx + tdw) * shapes[s].per_step;
        }
        tflops[mode] = step_flop / step_s / 1e12, step_ms[mode] = step_s * 1e3;
        tok_s[mode] = (double)M / step_s;
        printf("gemm_step: %.1f GFLOP in %.2f ms: %.1f TFLOP/s, MFU %.1f%% of %.0f TFLOP/s, "
               "%.0f tokens/s (GEMMs only)\n\n",
               step_flop / 1e9, step_ms[mode], tflops[mode], 100.0 * tflops[mode] / peak, peak,
               tok_s[mode]);
    }
    /* The LM head's weight gradient in the row chunks the head runs in
     * (mt_model_head_chunk: at least 2048 rows since 0.1, 1024 before):
     * its float32 [V, H] accumulator is read and written once a chunk,
     * 8 bytes an element against 2 c FLOPs, so small chunks lose to the
     * traffic.  The figures say where the floor belongs. */
    const int64_t V = 128256, H = 2048, rows[3] = {1024, 2048, 4096};
    double head_tf[3] = {0};
    be->copy_to_device(Y, fill, (size_t)(M * V) * 2);
    be->copy_to_device(X, fill, (size_t)(M * H) * 2);
    be->zero(dW, (size_t)(V * H) * 4);
    printf("bench_cuda_gemm: the LM head's weight gradient, dW [%lld, %lld] float32 += "
           "dlogits^T x, by chunk rows\n%8s %10s %9s\n",
           (long long)V, (long long)H, "rows", "ms", "TFLOP/s");
    for (int i = 0; i < 3 && rows[i] <= M; i++) {
        const double t = time_head_dw(dW, Y, X, V, H, rows[i], iters);
        head_tf[i] = 2.0 * (double)V * (double)H * (double)rows[i] / t / 1e12;
        printf("%8lld %10.3f %9.1f\n", (long long)rows[i], t * 1e3, head_tf[i]);
    }
    free(fill), free(fill32);
    printf("RESULT gemm_tflops=%.1f gemm_mfu_pct=%.1f gemm_tokens_per_s=%.0f "
           "fp32_storage_tflops=%.1f fp32_storage_mfu_pct=%.1f convert_tflops=%.1f "
           "convert_mfu_pct=%.1f head_dw_tflops_1024=%.1f head_dw_tflops_2048=%.1f "
           "head_dw_tflops_4096=%.1f\n",
           tflops[BF16], 100.0 * tflops[BF16] / peak, tok_s[BF16], tflops[FP32],
           100.0 * tflops[FP32] / peak, tflops[CONVERT], 100.0 * tflops[CONVERT] / peak,
           head_tf[0], head_tf[1], head_tf[2]);
    mt_cuda_backend_free();
    mt_cuda_arena_free(&arena);
    return 0;
}
