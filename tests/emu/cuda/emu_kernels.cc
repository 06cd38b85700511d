/* emu_kernels.cc: the runtime of the host emulation of the CUDA kernels
 * (tests/emu/cuda; what it models and checks is in emu_kernel.h): launch
 * checks, grids run block after block, and a block's threads as fibers
 * under a scheduler that releases barriers and resumes the runnable
 * fibers in a random order each round.
 *
 * The fibers are made once (ucontext, each on its own stack) and then
 * live for the whole program, running one thread of a block after
 * another; switches between them and the scheduler are _setjmp and
 * _longjmp, which save no signal mask (swapcontext's system call made
 * the emulation spend half its time in the kernel). */
#undef _FORTIFY_SOURCE /* its longjmp check refuses jumps between stacks */
#include <limits.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <map>
#include <vector>

#include <cuda_runtime.h>
#include "emu.h"

dim3 threadIdx, blockIdx, blockDim, gridDim;
unsigned char *emu_smem;
size_t emu_smem_bytes;

enum { EMU_RUN, EMU_WARP, EMU_BLOCK, EMU_DONE };
struct emu_thread_t {
    jmp_buf jb;
    int state, flag, started;
    char *stack;
};

static const size_t stack_bytes = (size_t)256 << 10;
static emu_thread_t th[1024];
static int nthreads, cur = -1, block_or;
static uint64_t mail[1024];
static jmp_buf sched;
static const std::function<void()> *body;
static const char *kernel_name = "?";
static uint64_t seed; /* MT_EMU_SEED, else a fixed one */
static std::map<const void *, int> smem_limit; /* cudaFuncSetAttribute */

static const int smem_default = 48 << 10;

/* the device's opt-in limit, as the runtime reports it (emu_runtime.c) */
static int smem_optin(void)
{
    int v = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0) != cudaSuccess)
        emu_kernel_fail("cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin) failed");
    return v;
}

void emu_kernel_fail(const char *what)
{
    fprintf(stderr, "CUDA kernel emulation: %s, block (%u,%u,%u) thread %d: %s\n", kernel_name,
            blockIdx.x, blockIdx.y, blockIdx.z, cur, what);
    abort();
}

static void yield(int state)
{
    th[cur].state = state;
    if (!_setjmp(th[cur].jb))
        _longjmp(sched, 1);
}

void __syncthreads(void) { th[cur].flag = 0, yield(EMU_BLOCK); }

int __syncthreads_or(int p)
{
    th[cur].flag = p != 0;
    yield(EMU_BLOCK);
    return block_or;
}

void __syncwarp(unsigned mask)
{
    if (mask != 0xffffffffu)
        emu_kernel_fail("__syncwarp with a partial mask (not modelled)");
    yield(EMU_WARP);
}

int emu_lane(void) { return cur & 31; }

/* one past the last thread of the warp that starts at thread w0 */
static int warp_end(int w0) { return w0 + 32 < nthreads ? w0 + 32 : nthreads; }

/* the live lanes of cur's warp, all of them waiting at one warp barrier */
static void full_warp(const char *what)
{
    const int w0 = cur & ~31, w1 = warp_end(w0);
    for (int i = w0; i < w1; i++)
        if (th[i].state == EMU_DONE)
            emu_kernel_fail(what);
}

uint64_t emu_exchange(unsigned mask, uint64_t mine, int src)
{
    if (mask != 0xffffffffu)
        emu_kernel_fail("shuffle with a partial mask (not modelled)");
    mail[cur] = mine;
    yield(EMU_WARP);
    full_warp("full-mask shuffle in a warp where some lanes have exited");
    const int from = (cur & ~31) | (src & 31);
    if (from >= nthreads)
        emu_kernel_fail("shuffle from a lane past the block's last thread");
    const uint64_t r = mail[from];
    yield(EMU_WARP);
    return r;
}

/* mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (PTX ISA, "Matrix
 * Fragments for mma.m16n8k16"): every lane posts its A (4 registers of
 * two bf16) and B (2) fragments, then computes its own 4 elements of D
 * from the posts, in the layout the ISA gives (lane l: group g = l / 4,
 * t = l % 4; A's register r holds row g + 8 (r & 1), columns
 * 8 (r >> 1) + 2 t + {0, 1}, the lower column in the low half; B's
 * register r rows 8 r + 2 t + {0, 1} of column g; C and D rows g (c0, c1)
 * and g + 8 (c2, c3), columns 2 t + {0, 1}).  Products of bf16 values are
 * exact in fp32; the sum runs in k order in fp32 (the tensor cores' order
 * is not modelled). */
static uint32_t mma_mail[1024][6];
static float mma_bf16(uint32_t w, int hi)
{
    const uint32_t b = (hi ? w >> 16 : w & 0xffffu) << 16;
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}
void emu_mma_bf16_16816(float c[4], const uint32_t a[4], const uint32_t b[2])
{
    memcpy(mma_mail[cur], a, 4 * sizeof *a);
    memcpy(mma_mail[cur] + 4, b, 2 * sizeof *b);
    yield(EMU_WARP);
    full_warp("mma.sync in a warp where some lanes have exited");
    const int w0 = cur & ~31, l = cur & 31, g = l / 4, t = l % 4;
    if (warp_end(w0) - w0 != 32)
        emu_kernel_fail("mma.sync in a warp of fewer than 32 threads");
    float d[4];
    for (int i = 0; i < 4; i++) {
        const int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
        float acc = c[i];
        for (int k = 0; k < 16; k++) {
            /* A[row][k]: lane (row % 8) * 4 + (k % 8) / 2, register (row >= 8) + 2 (k >= 8) */
            const uint32_t *pa = mma_mail[w0 + (row % 8) * 4 + (k % 8) / 2];
            const float av = mma_bf16(pa[(row >= 8) + 2 * (k >= 8)], k & 1);
            /* B[k][col]: lane col * 4 + (k % 8) / 2, register k >= 8 */
            const uint32_t *pb = mma_mail[w0 + col * 4 + (k % 8) / 2] + 4;
            const float bv = mma_bf16(pb[k >= 8], k & 1);
            acc += av * bv;
        }
        d[i] = acc;
    }
    yield(EMU_WARP);
    memcpy(c, d, sizeof d);
}

/* ldmatrix.sync.aligned.m8n8.{x1,x2,x4}[.trans].shared.b16 (PTX ISA,
 * "ldmatrix"): lanes 8 j .. 8 j + 7 give the rows of matrix j (8 bf16,
 * 16 bytes each, 16-byte aligned, in the dynamic shared memory); lane l
 * gets in register j row l / 4, elements 2 (l % 4) and 2 (l % 4) + 1 of
 * matrix j, or with .trans of its transpose (elements [2 (l % 4)][l / 4]
 * and [2 (l % 4) + 1][l / 4]), the first in the low half. */
static const unsigned char *ldm_mail[1024];
void emu_ldmatrix(uint32_t *r, int num, int trans, const void *p)
{
    ldm_mail[cur] = (const unsigned char *)p;
    yield(EMU_WARP);
    full_warp("ldmatrix in a warp where some lanes have exited");
    const int w0 = cur & ~31, l = cur & 31;
    if (warp_end(w0) - w0 != 32)
        emu_kernel_fail("ldmatrix in a warp of fewer than 32 threads");
    for (int j = 0; j < num; j++)
        for (int i = 0; i < 8; i++) {
            const unsigned char *row = ldm_mail[w0 + 8 * j + i];
            if ((uintptr_t)row % 16)
                emu_kernel_fail("ldmatrix: a row address not 16-byte aligned");
            if (row < emu_smem || row + 16 > emu_smem + emu_smem_bytes)
                emu_kernel_fail("ldmatrix: a row outside the dynamic shared memory");
        }
    for (int j = 0; j < num; j++) {
        uint16_t e[2];
        for (int h = 0; h < 2; h++) {
            const int row = trans ? 2 * (l % 4) + h : l / 4, col = trans ? l / 4 : 2 * (l % 4) + h;
            memcpy(&e[h], ldm_mail[w0 + 8 * j + row] + 2 * col, 2);
        }
        r[j] = (uint32_t)e[0] | (uint32_t)e[1] << 16;
    }
    yield(EMU_WARP);
}

/* cp.async.cg.shared.global, 16 bytes (PTX ISA, "cp.async"): each
 * thread's copies queue up and land at the latest moment the device
 * allows: at its cp.async.wait_all (every copy), or at its
 * cp.async.wait_group n for the copies of the groups it committed
 * (cp.async.commit_group) but the n newest.  So a tile read before the
 * wait that covers it, and the barrier after, finds the 0xff fill.  The
 * source is read then, not at the issue; the kernels copy inputs nothing
 * writes while they run.  A block's copies never waited for are dropped
 * with it (nothing could read them). */
struct emu_async_t {
    unsigned char *dst;
    const unsigned char *src;
    int bytes;
    long group; /* -1 until committed */
};
static std::vector<emu_async_t> async_q[1024];
static long async_groups[1024]; /* groups a thread committed in this block */

void emu_cp_async16(void *dst, const void *src, int src_bytes)
{
    unsigned char *d = (unsigned char *)dst;
    if ((uintptr_t)d % 16 || d < emu_smem || d + 16 > emu_smem + emu_smem_bytes)
        emu_kernel_fail("cp.async: a destination not 16-byte aligned in the dynamic shared memory");
    if (src_bytes != 0 && src_bytes != 16)
        emu_kernel_fail("cp.async: a source size other than 0 or 16 (not modelled)");
    if (src_bytes && ((uintptr_t)src % 16 || !mt_emu_device_ptr(src)))
        emu_kernel_fail("cp.async: a source not 16-byte aligned device memory");
    async_q[cur].push_back({d, (const unsigned char *)src, src_bytes, -1});
}

void emu_cp_async_commit(void)
{
    for (emu_async_t &c : async_q[cur])
        if (c.group < 0)
            c.group = async_groups[cur];
    async_groups[cur]++;
}

/* land this thread's copies of groups below `upto` (all: LONG_MAX) */
static void async_land(long upto)
{
    std::vector<emu_async_t> &q = async_q[cur];
    size_t keep = 0;
    for (size_t i = 0; i < q.size(); i++) {
        const emu_async_t &c = q[i];
        if (c.group < 0 ? upto == LONG_MAX : c.group < upto) {
            memcpy(c.dst, c.src, (size_t)c.bytes);
            memset(c.dst + c.bytes, 0, (size_t)(16 - c.bytes));
        } else {
            q[keep++] = c;
        }
    }
    q.resize(keep);
}

void emu_cp_async_wait_all(void) { async_land(LONG_MAX); }

void emu_cp_async_wait_group(int n)
{
    if (n < 0)
        emu_kernel_fail("cp.async.wait_group with a negative count");
    async_land(async_groups[cur] - n);
}

unsigned __ballot_sync(unsigned mask, int pred)
{
    if (mask != 0xffffffffu)
        emu_kernel_fail("__ballot_sync with a partial mask (not modelled)");
    mail[cur] = pred != 0;
    yield(EMU_WARP);
    full_warp("full-mask ballot in a warp where some lanes have exited");
    unsigned r = 0;
    const int w0 = cur & ~31;
    for (int i = w0; i < warp_end(w0); i++)
        r |= (unsigned)(mail[i] != 0) << (i - w0);
    yield(EMU_WARP);
    return r;
}

static uint64_t block_serial; /* one per block run */
void emu_poison_shared(void *p, size_t bytes)
{
    static std::map<void *, uint64_t> done; /* the block each one was filled in */
    uint64_t &b = done[p];
    if (b != block_serial) {
        memset(p, 0xff, bytes);
        b = block_serial;
    }
}

void emu_check_pointer(const char *kernel, int arg, const void *p)
{
    if (mt_emu_device_ptr(p))
        return;
    fprintf(stderr, "CUDA kernel emulation: %s: argument %d (%p) is not device memory\n",
            kernel, arg, p);
    abort();
}

/* a fault inside a kernel (past the dynamic shared memory's guard page, a
 * fiber's stack overflow, a wild pointer): name the kernel, block and
 * thread, then die of the signal (snprintf is not async-signal-safe, but
 * the process is ending anyway) */
static void on_fault(int sig)
{
    char msg[256];
    const int n = snprintf(msg, sizeof msg,
                           "CUDA kernel emulation: signal %d in %s, block (%u,%u,%u) thread %d "
                           "(an access out of bounds: past the dynamic shared memory or a "
                           "thread's stack, a wild pointer)\n",
                           sig, kernel_name, blockIdx.x, blockIdx.y, blockIdx.z, cur);
    if (write(2, msg, n > 0 ? (size_t)n : 0) < 0) {
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

cudaError_t emu_func_set_smem(const void *kernel, int bytes)
{
    if (bytes < 0 || bytes > smem_optin())
        return cudaErrorInvalidValue;
    smem_limit[kernel] = bytes;
    return cudaSuccess;
}

static uint64_t rnd(void)
{
    if (!seed) {
        const char *e = getenv("MT_EMU_SEED");
        seed = e && strtoull(e, NULL, 0) ? strtoull(e, NULL, 0) : 0x2545f4914f6cdd1dull;
    }
    seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
    return seed;
}

/* a[0..n) in a random order (Fisher-Yates) */
template <typename T> static void shuffle(T *a, uint64_t n)
{
    for (uint64_t i = n; i > 1; i--) {
        const uint64_t j = rnd() % i;
        const T t = a[i - 1];
        a[i - 1] = a[j], a[j] = t;
    }
}

/* a fiber: one thread of a block after another, for ever */
static void entry(void)
{
    for (;;) {
        (*body)();
        yield(EMU_DONE);
    }
}

/* run fiber i until its next barrier or its end */
static void resume(int i)
{
    if (_setjmp(sched))
        return;
    if (th[i].started)
        _longjmp(th[i].jb, 1);
    th[i].started = 1;
    if (!th[i].stack) { /* a PROT_NONE page below: an overflow faults (on_fault) */
        const size_t page = (size_t)sysconf(_SC_PAGESIZE);
        char *m = (char *)mmap(NULL, stack_bytes + page, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED || mprotect(m, page, PROT_NONE))
            emu_kernel_fail("out of host memory for the fibers' stacks");
        th[i].stack = m + page;
    }
    static ucontext_t from, to;
    getcontext(&to);
    to.uc_stack.ss_sp = th[i].stack;
    to.uc_stack.ss_size = stack_bytes;
    to.uc_link = NULL;
    makecontext(&to, entry, 0);
    swapcontext(&from, &to); /* the fiber's first start; it comes back by _longjmp */
}

/* One block.  Two schedules, drawn per block:
 *  - interleaved: every runnable fiber runs each round, in a random order;
 *  - warp priority: warps in a random order of priority, and each round
 *    only the first warp with a runnable lane runs.  A warp then runs
 *    ahead until a block barrier (or its end) before the next one moves:
 *    the skew that finds a shared buffer rewritten by one warp while
 *    another still reads it, with the barrier between them missing. */
static void run_block(int threads, size_t smem)
{
    nthreads = threads;
    block_serial++;
    memset(emu_smem, 0xff, smem);
    for (int i = 0; i < threads; i++)
        th[i].state = EMU_RUN, th[i].flag = 0, async_q[i].clear(), async_groups[i] = 0;
    const int nwarps = (threads + 31) / 32;
    int order[1024], prio[32];
    for (int w = 0; w < nwarps; w++)
        prio[w] = w;
    shuffle(prio, (uint64_t)nwarps);
    const bool by_warp = rnd() & 1;
    for (;;) {
        int n = 0;
        if (by_warp) {
            for (int p = 0; p < nwarps && n == 0; p++) {
                for (int i = prio[p] * 32; i < warp_end(prio[p] * 32); i++)
                    if (th[i].state == EMU_RUN)
                        order[n++] = i;
            }
        } else {
            for (int i = 0; i < threads; i++)
                if (th[i].state == EMU_RUN)
                    order[n++] = i;
        }
        shuffle(order, (uint64_t)n); /* a random order each round */
        for (int i = 0; i < n; i++) {
            cur = order[i];
            threadIdx.x = (unsigned)cur % blockDim.x;
            threadIdx.y = (unsigned)cur / blockDim.x % blockDim.y;
            threadIdx.z = (unsigned)cur / (blockDim.x * blockDim.y);
            resume(cur);
        }
        int done = 0, atblock = 0, running = 0;
        for (int i = 0; i < threads; i++)
            done += th[i].state == EMU_DONE, atblock += th[i].state == EMU_BLOCK,
                running += th[i].state == EMU_RUN;
        if (done == threads)
            break;
        for (int w0 = 0; w0 < threads; w0 += 32) { /* a warp whose live lanes all wait */
            int wait = 0, live = 0;
            const int w1 = warp_end(w0);
            for (int i = w0; i < w1; i++)
                live += th[i].state != EMU_DONE, wait += th[i].state == EMU_WARP;
            if (wait && wait == live)
                for (int i = w0; i < w1; i++)
                    if (th[i].state == EMU_WARP)
                        th[i].state = EMU_RUN, running++;
        }
        if (running == 0 && atblock == threads) {
            block_or = 0;
            for (int i = 0; i < threads; i++)
                block_or |= th[i].flag, th[i].state = EMU_RUN;
            running = threads;
        }
        if (running == 0) {
            cur = -1;
            emu_kernel_fail(atblock && done ? "__syncthreads after some threads exited"
                                            : "deadlock: a warp waits at two different barriers");
        }
    }
    cur = -1;
}

/* The dynamic shared memory of a launch: smem bytes, 128-byte aligned,
 * that end at most 127 bytes before a PROT_NONE page (so an access past
 * them faults, on_fault), also when smem is 0. */
static unsigned char *smem_map(size_t smem, void **base, size_t *len)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), need = (smem + 127) / 128 * 128;
    const size_t body = (need + page - 1) / page * page;
    *len = body + page;
    *base = mmap(NULL, *len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (*base == MAP_FAILED)
        emu_kernel_fail("mmap of the dynamic shared memory failed");
    if (mprotect((char *)*base + body, page, PROT_NONE))
        emu_kernel_fail("mprotect of the shared memory's guard page failed");
    return (unsigned char *)*base + body - need;
}

void emu_grid(dim3 grid, dim3 block, size_t smem, cudaStream_t s, const void *kernel,
              const char *name, const std::function<void()> &fn)
{
    kernel_name = name;
    blockIdx = dim3(0, 0, 0);
    const uint64_t threads = (uint64_t)block.x * block.y * block.z;
    if (threads == 0 || threads > 1024 || block.z > 64)
        emu_kernel_fail("launch: block size not in 1..1024 (invalid configuration)");
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 ||
        grid.z > 65535)
        emu_kernel_fail("launch: grid dimension out of range (invalid configuration)");
    auto lim = smem_limit.find(kernel);
    const size_t allowed = lim == smem_limit.end() ? (size_t)smem_default : (size_t)lim->second;
    if (smem > allowed)
        emu_kernel_fail(smem > (size_t)smem_optin()
                            ? "launch: more dynamic shared memory than the device has"
                            : "launch: dynamic shared memory above 48 KiB without "
                              "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
    mt_emu_drain(s);
    mt_emu_kernel(); /* the NCCL emulation's kernel count */
    /* faults inside the grid name the kernel; the handler runs on its own
     * stack, so a fiber's stack overflow reaches it too */
    static bool altstack;
    if (!altstack) {
        static char alt[1 << 16];
        stack_t ss;
        ss.ss_sp = alt, ss.ss_size = sizeof alt, ss.ss_flags = 0;
        sigaltstack(&ss, NULL);
        altstack = true;
    }
    struct sigaction sa, old_segv, old_bus;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fault;
    sa.sa_flags = SA_ONSTACK;
    sigaction(SIGSEGV, &sa, &old_segv);
    sigaction(SIGBUS, &sa, &old_bus);
    void *base;
    size_t len;
    emu_smem = smem_map(smem, &base, &len);
    emu_smem_bytes = smem;
    body = &fn;
    gridDim = grid, blockDim = block;
    /* the blocks in a random order: nothing may depend on it */
    const uint64_t nblocks = (uint64_t)grid.x * grid.y * grid.z;
    std::vector<uint64_t> order(nblocks);
    for (uint64_t i = 0; i < nblocks; i++)
        order[i] = i;
    shuffle(order.data(), nblocks);
    for (uint64_t b : order) {
        blockIdx = dim3((unsigned)(b % grid.x), (unsigned)(b / grid.x % grid.y),
                        (unsigned)(b / ((uint64_t)grid.x * grid.y)));
        run_block((int)threads, smem);
    }
    body = NULL;
    munmap(base, len);
    emu_smem = NULL;
    sigaction(SIGSEGV, &old_segv, NULL);
    sigaction(SIGBUS, &old_bus, NULL);
    kernel_name = "?";
}
