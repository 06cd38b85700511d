# tests/emu: the host emulation of CUDA and NCCL.
# The NCCL and CUDA-stream code paths on the host (tests/emu/nccl;
# doc/gpu.md, "Host emulation of the NCCL paths"): the library's C files
# and the apps compiled again against emulated cuda_runtime.h and nccl.h
# (communicators over MPI, streams as queues of MPI requests, kernels from
# the CPU backend), whatever configure found, so every build runs the
# trainer's NCCL paths: tests/emu/nccl_emulation.sh trains each mesh with
# distributed.device cuda and collectives nccl against the CPU run.
EMU_NCCL_FILES = tests/emu/nccl/cuda_runtime.h tests/emu/nccl/nccl.h tests/emu/nccl/emu.h \
	tests/emu/nccl/emu_runtime.c tests/emu/nccl/emu_backend.c tests/emu/nccl/build.sh
EMU_NCCL_BIN = tests/emu/nccl/build/bin/meshtrain-dense
EXTRA_DIST += $(EMU_NCCL_FILES) tests/emu/nccl_emulation.sh
# FORCE: build.sh runs every time and decides itself what is stale (every
# object when any header is newer), so a header that no prerequisite here
# names still reaches the emulated builds
$(EMU_NCCL_BIN): FORCE $(src_libmeshtrain_la_SOURCES) $(EMU_NCCL_FILES) $(MT_CUDA_C) \
		src/comm/nccl_comm.c src/comm/mt_nccl.h src/backend/cuda/cuda_internal.h \
		src/backend/cuda/mt_cuda.h apps/meshtrain-dense.c \
		apps/meshtrain-moe.c apps/meshtrain-cp.c apps/meshtrain-ckpt.c apps/meshtrain-plan.c \
		apps/meshtrain-data.c config.h
	$(AM_V_GEN)CC='$(CC)' CPPFLAGS='$(DEFS) $(DEFAULT_INCLUDES) $(AM_CPPFLAGS) $(CPPFLAGS)' \
		CFLAGS='$(AM_CFLAGS) $(CFLAGS)' \
		LIBS='$(YAML_LIBS) $(JANSSON_LIBS) $(CRYPTO_LIBS) $(HDF5_LIBS) $(PCRE2_LIBS) $(UTF8PROC_LIBS) $(ZSTD_LIBS) $(BLAS_LIBS) $(LIBS) -lm -lpthread' \
		$(SHELL) $(srcdir)/tests/emu/nccl/build.sh $(srcdir) tests/emu/nccl/build \
		$(filter %.c,$(src_libmeshtrain_la_SOURCES)) $(MT_CUDA_C) src/comm/nccl_comm.c
check_DATA += $(EMU_NCCL_BIN)
TESTS += tests/emu/nccl_emulation.sh
emulate-nccl: $(EMU_NCCL_BIN) share/data/tiny-corpus.bin
	abs_top_builddir='$(abs_top_builddir)' abs_top_srcdir='$(abs_top_srcdir)' \
		MPIEXEC='$(MPIEXEC)' MPIEXEC_NP='$(MPIEXEC_NP)' OMP_NUM_THREADS=1 \
		$(SHELL) $(srcdir)/tests/emu/nccl_emulation.sh
clean-local: clean-emulate-nccl
clean-emulate-nccl:
	-rm -rf tests/emu/nccl/build
FORCE:
.PHONY: emulate-nccl clean-emulate-nccl FORCE

# The CUDA backend's own kernels on the host (tests/emu/cuda; doc/gpu.md,
# "Host emulation of the CUDA kernels"): the .cu files, their <<<>>>
# launches rewritten (rewrite.pl), compiled by $(CC) as C++ against
# emulated CUDA headers (fibers for threads, barriers and shuffles, WMMA,
# cuBLAS/cuBLASLt and CUB as checked host loops) and linked with the NCCL
# emulation's objects, so every build runs the CUDA kernel tests and trains
# on them: tests/emu/cuda_emulation.sh.  No nvcc and no GPU needed.
EMU_CUDA_FILES = tests/emu/cuda/cuda_runtime.h tests/emu/cuda/emu_kernel.h \
	tests/emu/cuda/cuda_bf16.h tests/emu/cuda/mma.h tests/emu/cuda/cublas_v2.h \
	tests/emu/cuda/cublasLt.h tests/emu/cuda/cub/device/device_radix_sort.cuh \
	tests/emu/cuda/emu_kernels.cc tests/emu/cuda/emu_blas.cc tests/emu/cuda/rewrite.pl \
	tests/emu/cuda/build.sh
EMU_CUDA_BIN = tests/emu/cuda/build/bin/test_cuda_kernels
EXTRA_DIST += $(EMU_CUDA_FILES) tests/emu/cuda_emulation.sh
$(EMU_CUDA_BIN): FORCE $(EMU_NCCL_BIN) $(EMU_CUDA_FILES) $(MT_CUDA_SRCS) $(MT_CUDA_HDRS) \
		src/backend/cuda/cuda_common.cuh src/backend/cuda/cuda_attention_tile.cuh src/backend/cuda/cuda_attention_tc.cuh \
		tests/backend/cuda/test_cuda_kernels.c \
		tests/backend/cuda/test_cuda_kernels.h tests/backend/cuda/test_cuda_attention.c tests/backend/cuda/test_cuda_kernels_moe.c \
		tests/backend/cuda/test_cuda_bf16.c tests/backend/cuda/test_cuda_storage.c
	$(AM_V_GEN)CC='$(CC)' CPPFLAGS='$(DEFS) $(DEFAULT_INCLUDES) $(AM_CPPFLAGS) $(CPPFLAGS)' \
		CFLAGS='$(AM_CFLAGS) $(CFLAGS)' \
		LIBS='$(YAML_LIBS) $(JANSSON_LIBS) $(CRYPTO_LIBS) $(HDF5_LIBS) $(PCRE2_LIBS) $(UTF8PROC_LIBS) $(ZSTD_LIBS) $(BLAS_LIBS) $(LIBS) -lm -lpthread' \
		$(SHELL) $(srcdir)/tests/emu/cuda/build.sh $(srcdir) tests/emu/cuda/build \
		tests/emu/nccl/build/obj
check_DATA += $(EMU_CUDA_BIN)
TESTS += tests/emu/cuda_emulation.sh
emulate-cuda: $(EMU_CUDA_BIN) share/data/tiny-corpus.bin
	abs_top_builddir='$(abs_top_builddir)' abs_top_srcdir='$(abs_top_srcdir)' \
		MPIEXEC='$(MPIEXEC)' MPIEXEC_NP='$(MPIEXEC_NP)' OMP_NUM_THREADS=1 \
		$(SHELL) $(srcdir)/tests/emu/cuda_emulation.sh
clean-local: clean-emulate-cuda
clean-emulate-cuda:
	-rm -rf tests/emu/cuda/build
.PHONY: emulate-cuda clean-emulate-cuda
