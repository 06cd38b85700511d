/* emu_backend.c: the CUDA backend's C entry points for the host emulation
 * (`make emulate-nccl`), in place of the .cu files: the tables of
 * mt_backend_cuda() and mt_backend_cuda_bf16() are the CPU backend's
 * (mt_backend_cuda_bf16_storage() the CPU storage table's)
 * kernels on "device" memory from the trainer's pool (cuda_setup.c,
 * compiled as is against the emulated runtime), each entry run once its
 * compute stream is drained; the stream, the bf16 conversions the NCCL
 * layer launches, and the backend's set-up.  So an emulated run computes
 * what the CPU backend computes, and a parity test can ask for the same
 * losses bit for bit. */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"
#include "emu.h"
#include "mt_bf16.h"
#include "mt_backend.h"

static const mt_backend_t *cpu;

static void enter(void)
{
    if (!cpu)
        mt_cuda_die("a kernel", "mt_cuda_backend_init was not called", __FILE__, __LINE__);
    mt_emu_drain(mt_emu_compute_stream());
    mt_emu_kernel();
}

/* each entry twice: on the CPU table (e_), and on the CPU's bf16-storage
 * table (s_, for mt_backend_cuda_bf16_storage) */
static const mt_backend_t *cpu_storage;
#define MT_BACKEND_VOID(name, params, args, ...)                              \
    static void e_##name params                                               \
    {                                                                         \
        enter();                                                              \
        cpu->name args;                                                       \
    }                                                                         \
    static void s_##name params                                               \
    {                                                                         \
        enter();                                                              \
        cpu_storage->name args;                                               \
    }
#define MT_BACKEND_DOUBLE(name, params, args, ...)                            \
    static double e_##name params                                             \
    {                                                                         \
        enter();                                                              \
        return cpu->name args;                                                \
    }                                                                         \
    static double s_##name params                                             \
    {                                                                         \
        enter();                                                              \
        return cpu_storage->name args;                                        \
    }
#include "backend_entries.def"
#undef MT_BACKEND_VOID
#undef MT_BACKEND_DOUBLE

static void e_synchronize_all(void) { mt_emu_drain_all(); }

static void *e_device_alloc(size_t bytes)
{
    void *p = mt_cuda_pool_alloc(bytes);
    if (!p && posix_memalign(&p, 256, bytes ? bytes : 1) != 0)
        return NULL;
    memset(p, 0, bytes);
    return p;
}

static void e_device_free(void *p)
{
    if (p && !mt_cuda_pool_free(p))
        free(p);
}

#define MT_BACKEND_VOID(name, ...) .name = e_##name,
#define MT_BACKEND_DOUBLE(name, ...) .name = e_##name,
static mt_backend_t fp32_table = {
#include "backend_entries.def"
    .device_alloc = e_device_alloc,
    .device_free = e_device_free,
    .name = "cuda",
};
static mt_backend_t bf16_table = {
#include "backend_entries.def"
    .device_alloc = e_device_alloc,
    .device_free = e_device_free,
    .name = "cuda_bf16",
};
#undef MT_BACKEND_VOID
#undef MT_BACKEND_DOUBLE
#define MT_BACKEND_VOID(name, ...) .name = s_##name,
#define MT_BACKEND_DOUBLE(name, ...) .name = s_##name,
static mt_backend_t storage_table = {
#include "backend_entries.def"
    .device_alloc = e_device_alloc,
    .device_free = e_device_free,
    .name = "cuda_bf16_storage",
    .rounds_bf16 = true,
    .reads_bf16 = true,
    .stores_bf16 = true,
};
#undef MT_BACKEND_VOID
#undef MT_BACKEND_DOUBLE

mt_status_t mt_cuda_backend_init(mt_cuda_arena_t *arena, size_t scratch_bytes)
{
    void *p;
    MT_TRY(mt_cuda_arena_alloc(arena, MT_CUDA_LT_WORKSPACE_BYTES, &p));
    MT_TRY(mt_cuda_arena_alloc(arena, scratch_bytes, &p));
    cpu = mt_backend_cpu();
    cpu_storage = mt_backend_cpu_bf16_storage();
    fp32_table.synchronize = e_synchronize_all;
    bf16_table.synchronize = e_synchronize_all;
    storage_table.synchronize = e_synchronize_all;
    return MT_OK;
}

void mt_cuda_backend_free(void) {}

/* the CPU kernels run the GEMMs here: no cuBLASLt plans */
void mt_cuda_lt_stats(mt_cuda_lt_stats_t *st) { memset(st, 0, sizeof *st); }

/* the tables exist before the set-up (callers compare against them); the
 * CPU kernels they call are there once it ran */
const mt_backend_t *mt_backend_cuda(void) { return &fp32_table; }
const mt_backend_t *mt_backend_cuda_bf16(void) { return &bf16_table; }
const mt_backend_t *mt_backend_cuda_bf16_storage(void) { return &storage_table; }

bool mt_cuda_attention_tc_supported(int64_t hd)
{
    (void)hd;
    return false;
}

void *mt_cuda_stream(void) { return mt_emu_compute_stream(); }

mt_status_t mt_cuda_synchronize(void)
{
    mt_emu_drain_all();
    return MT_OK;
}

void mt_cuda_launch_convert(cudaStream_t s, void *dst, const void *src, int64_t n, bool to_bf16)
{
    mt_emu_copy(s, dst, src, n, to_bf16 ? 1 : 2);
}

void mt_cuda_f32_to_bf16(uint16_t *dst, const float *src, int64_t n)
{
    mt_cuda_launch_convert(mt_emu_compute_stream(), dst, src, n, true);
}

void mt_cuda_bf16_to_f32(float *dst, const uint16_t *src, int64_t n)
{
    mt_cuda_launch_convert(mt_emu_compute_stream(), dst, src, n, false);
}
