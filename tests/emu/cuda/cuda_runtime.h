/* cuda_runtime.h: the host emulation of the CUDA kernels (tests/emu/cuda,
 * `make emulate-cuda`, doc/gpu.md "Host emulation of the CUDA kernels").
 * The runtime API is the NCCL emulation's (tests/emu/nccl/cuda_runtime.h,
 * emu_runtime.c); C++ files also get what kernels use (emu_kernel.h):
 * thread indices, barriers, shuffles and <<<>>> launches, which build.sh
 * rewrites into emu_launch(...).go(kernel, args). */
#ifndef MT_EMU_KERNEL_CUDA_RUNTIME_H
#define MT_EMU_KERNEL_CUDA_RUNTIME_H

#include_next <cuda_runtime.h>

#ifdef __cplusplus
#include "emu_kernel.h"
#endif

#endif
