/* emu.h: what the host emulation's backend (emu_backend.c) asks of its
 * runtime (emu_runtime.c); tests/emu/nccl, `make emulate-nccl`. */
#ifndef MT_EMU_H
#define MT_EMU_H

#include <stdint.h>

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Everything queued on s done (the host then runs s's next kernel). */
void mt_emu_drain(cudaStream_t s);
/* Every stream drained. */
void mt_emu_drain_all(void);
/* Test every stream's queue without blocking. */
void mt_emu_progress(void);
/* A copy on stream s: n bytes (mode 0), or n elements float32 to bf16
 * (1) or back (2).  On the compute stream it runs now; on another it is
 * queued and runs when something waits for it. */
void mt_emu_copy(cudaStream_t s, void *dst, const void *src, int64_t n, int mode);
/* The conversions (emu_runtime.c): to_bf16, else bf16 to float32. */
void mt_emu_convert(void *dst, const void *src, int64_t n, int to_bf16);
/* A compute-stream kernel was launched (the overlap report). */
void mt_emu_kernel(void);
/* The backend's compute stream (mt_cuda_stream()). */
cudaStream_t mt_emu_compute_stream(void);
/* p lies in memory from cudaMalloc or cudaMallocHost (what a kernel or
 * a library call may be given) */
int mt_emu_device_ptr(const void *p);

#ifdef __cplusplus
}
#endif
#endif
