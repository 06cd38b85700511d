/* tc_emulate: src/cuda_attention_tc.cu's tensor-core attention kernels,
 * run on the host under tests/emu/tc_emulate.h (fibers for CUDA threads,
 * a WMMA model that checks ldm, alignment and shared-memory bounds),
 * against the CPU backend: plain causal, GQA, documents, T not a multiple
 * of the tile, head dims 64 and 128, the scalar (unaligned) load path,
 * and the same bits under two different thread schedules (a race between
 * barriers would change them).  The same normwise bounds as
 * tests/test_cuda_bf16.c.
 *
 * For machines without a GPU: it checks the kernels' indexing, masks,
 * partial tiles and barrier placement, not the hardware (fragment
 * layouts are modelled as opaque, tensor-core rounding is not).  Built
 * and run by `make emulate-attention-tc` (C++17 compiler, no nvcc; add
 * EMU_CXXFLAGS=-fsanitize=address for out-of-bounds checks of global
 * memory).  Exit 0 pass, 1 fail. */
#define MT_TC_EMULATE 1
#include "cuda_attention_tc.cu"

#include "mt_backend.h"

static int failures, checks;

static double normwise(const float *got, const float *ref, int64_t n)
{
    double md = 0.0, mr = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - (double)ref[i]);
        md = d > md || d != d ? d : md;
        mr = fabs((double)ref[i]) > mr ? fabs((double)ref[i]) : mr;
    }
    return mr > 0 ? md / mr : md;
}

static void check_close(const char *what, const char *tag, const float *got, const float *ref,
                        int64_t n, double tol)
{
    const double e = normwise(got, ref, n);
    checks++;
    printf("  %-4s %-40s normwise %.3g (bound %.2g)%s\n", what, tag, e, tol,
           e <= tol ? "" : "  FAIL");
    failures += !(e <= tol);
}

static void check_same(const char *what, const char *tag, const float *a, const float *b,
                       int64_t n)
{
    checks++;
    if (memcmp(a, b, (size_t)n * sizeof(float))) {
        printf("  %-4s %-40s bytes differ between schedules  FAIL\n", what, tag);
        failures++;
    }
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float uniform_bf16(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    const float f = (float)((double)(rng >> 11) * (2.0 / 9007199254740992.0) - 1.0);
    return __bfloat162float(__float2bfloat16_rn(f));
}

static float *rand_bf16(int64_t n)
{
    float *x = (float *)malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        x[i] = uniform_bf16();
    return x;
}

static float *nans(int64_t n)
{
    float *x = (float *)malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        x[i] = NAN;
    return x;
}

/* the kernels' arguments (the fibers' bodies take none) */
static float *a_out, *a_lse, *a_dq, *a_dk, *a_dv;
static const float *a_q, *a_k, *a_v, *a_dout, *a_D, *a_L;
static tc_geom_t a_G;

template <int HD> static void body_forward(void)
{
    mt_k_attention_tc_forward<HD>(a_out, a_lse, a_q, a_k, a_v, a_G);
}
template <int HD> static void body_dq(void)
{
    mt_k_attention_tc_dq<HD>(a_dq, a_dout, a_L, a_D, a_q, a_k, a_v, a_G);
}
template <int HD> static void body_dkdv(void)
{
    mt_k_attention_tc_dkdv<HD>(a_dk, a_dv, a_dout, a_L, a_D, a_q, a_k, a_v, a_G);
}

static void launch(void (*body)(void), size_t smem, int64_t gx, int64_t gy, int64_t gz)
{
    gridDim.x = (unsigned)gx, gridDim.y = (unsigned)gy, gridDim.z = (unsigned)gz;
    for (int64_t z = 0; z < gz; z++)
        for (int64_t y = 0; y < gy; y++)
            for (int64_t x = 0; x < gx; x++) {
                blockIdx.x = (unsigned)x, blockIdx.y = (unsigned)y, blockIdx.z = (unsigned)z;
                emu_run_block(body, TC_THREADS, smem);
            }
}

template <int HD> static void run_all(const tc_geom_t &G)
{
    a_G = G;
    const int64_t nt = (G.T + 63) / 64;
    launch(body_forward<HD>, tc_smem_forward<HD>(), nt, G.nh, G.B);
    launch(body_dq<HD>, tc_smem_dq<HD>(), nt, G.nh, G.B);
    launch(body_dkdv<HD>, tc_smem_dkdv<HD>(), nt, G.nkv, G.B);
}

static void one_case(int64_t B, int64_t T, int64_t nh, int64_t nkv, int64_t hd, int docs,
                     int vec)
{
    char tag[128];
    snprintf(tag, sizeof tag, "B=%lld T=%lld nh=%lld nkv=%lld hd=%lld%s%s", (long long)B,
             (long long)T, (long long)nh, (long long)nkv, (long long)hd, docs ? " docs" : "",
             vec ? "" : " scalar");
    printf("case %s\n", tag);
    const int64_t nq = B * T * nh * hd, nk = B * T * nkv * hd, nl = B * nh * T;
    float *q = rand_bf16(nq), *k = rand_bf16(nk), *v = rand_bf16(nk), *dout = rand_bf16(nq);
    int32_t *doc = NULL;
    if (docs) { /* documents of 1..T/3+1 tokens */
        doc = (int32_t *)malloc((size_t)(B * T) * sizeof(int32_t));
        for (int64_t b = 0; b < B; b++) {
            int64_t start = 0, left = 0;
            for (int64_t t = 0; t < T; t++) {
                if (left == 0) {
                    start = t;
                    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
                    left = 1 + (int64_t)(rng % (uint64_t)(T / 3 + 1));
                }
                doc[b * T + t] = (int32_t)start;
                left--;
            }
        }
    }
    const mt_backend_t *cpu = mt_backend_cpu();
    float *out = nans(nq), *lse = nans(nl), *dq = nans(nq), *dk = nans(nk), *dv = nans(nk);
    cpu->attention_forward(out, lse, q, k, v, doc, B, T, nh, nkv, hd);
    cpu->attention_backward(dq, dk, dv, dout, out, lse, q, k, v, doc, B, T, nh, nkv, hd);
    /* D from the CPU's out (the GPU test feeds the CPU's out and lse too) */
    float *D = (float *)malloc((size_t)nl * sizeof(float));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < nh; h++)
            for (int64_t t = 0; t < T; t++) {
                float s = 0.0f;
                for (int64_t d = 0; d < hd; d++)
                    s += dout[(b * T + t) * nh * hd + h * hd + d] *
                         out[(b * T + t) * nh * hd + h * hd + d];
                D[(b * nh + h) * T + t] = s;
            }

    tc_geom_t G;
    G.B = B, G.T = T, G.nh = nh, G.nkv = nkv, G.group = nh / nkv;
    G.qstride = nh * hd, G.kvstride = nkv * hd;
    G.scale = (float)(1.0 / sqrt((double)hd));
    G.vec = vec, G.doc_start = doc;
    float *res[2][5];
    for (int run = 0; run < 2; run++) {
        emu_seed = run ? 0x5555aaaa1234ull : 1;
        a_out = res[run][0] = nans(nq), a_lse = res[run][1] = nans(nl);
        a_dq = res[run][2] = nans(nq), a_dk = res[run][3] = nans(nk);
        a_dv = res[run][4] = nans(nk);
        a_q = q, a_k = k, a_v = v, a_dout = dout, a_D = D, a_L = lse;
        if (hd == 64)
            run_all<64>(G);
        else
            run_all<128>(G);
    }
    check_close("out", tag, res[0][0], out, nq, 1.6e-2);
    check_close("lse", tag, res[0][1], lse, nl, 1e-4);
    check_close("dq", tag, res[0][2], dq, nq, 1.6e-2);
    check_close("dk", tag, res[0][3], dk, nk, 1.6e-2);
    check_close("dv", tag, res[0][4], dv, nk, 1.6e-2);
    const int64_t sizes[5] = {nq, nl, nq, nk, nk};
    const char *names[5] = {"out", "lse", "dq", "dk", "dv"};
    for (int i = 0; i < 5; i++) {
        check_same(names[i], tag, res[0][i], res[1][i], sizes[i]);
        free(res[0][i]), free(res[1][i]);
    }
    free(q), free(k), free(v), free(dout), free(doc), free(out), free(lse), free(dq), free(dk);
    free(dv), free(D);
}

int main(void)
{
    one_case(2, 77, 4, 4, 64, 0, 1);   /* plain causal, partial tile */
    one_case(1, 200, 8, 2, 64, 0, 1);  /* GQA 4 */
    one_case(2, 150, 4, 2, 64, 1, 1);  /* documents */
    one_case(1, 130, 4, 1, 128, 1, 1); /* hd 128, GQA 4, documents */
    one_case(1, 64, 2, 1, 128, 0, 0);  /* one full tile, scalar loads */
    one_case(1, 1, 2, 2, 64, 0, 1);    /* one token */
    printf("tc_emulate: %d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
