# tests/backend/cuda: the CUDA kernels against the CPU ones (with nvcc: on
# a GPU, else they skip; every build also runs them under the host
# emulation, tests/emu), and the bf16-numerics table (tensor-core GEMM and
# attention) against the CPU
MT_CUDA_TEST_SRCS = tests/backend/cuda/test_cuda_kernels.c tests/backend/cuda/test_cuda_attention.c \
	tests/backend/cuda/test_cuda_kernels_moe.c tests/backend/cuda/test_cuda_kernels.h \
	tests/backend/cuda/test_cuda_bf16.c tests/backend/cuda/test_cuda_storage.c
EXTRA_DIST += $(MT_CUDA_TEST_SRCS)
if HAVE_CUDA
check_PROGRAMS += tests/backend/cuda/test_cuda_kernels tests/backend/cuda/test_cuda_bf16
tests_backend_cuda_test_cuda_kernels_SOURCES = tests/backend/cuda/test_cuda_kernels.c \
	tests/backend/cuda/test_cuda_attention.c tests/backend/cuda/test_cuda_kernels_moe.c \
	tests/backend/cuda/test_cuda_kernels.h tests/harness/mt_test.h
tests_backend_cuda_test_cuda_bf16_SOURCES = tests/backend/cuda/test_cuda_bf16.c \
	tests/backend/cuda/test_cuda_storage.c tests/backend/cuda/test_cuda_kernels.h \
	tests/harness/mt_test.h
TESTS += tests/backend/cuda/test_cuda_kernels tests/backend/cuda/test_cuda_bf16
endif
