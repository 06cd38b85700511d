# tests/backend: the CPU kernels against double-precision references; the
# kernel tests set their own OpenMP thread counts, so they link the
# runtime themselves.  bf16 storage: each entry against the rounding
# table, bit for bit.
check_PROGRAMS += tests/backend/test_kernels tests/backend/test_kernels_softmax \
	tests/backend/test_kernels_layers tests/backend/test_kernels_bf16 \
	tests/backend/test_kernels_storage tests/backend/test_kernels_window
tests_backend_test_kernels_SOURCES = tests/backend/test_kernels.c tests/backend/test_kernels.h \
	tests/harness/mt_test.h
tests_backend_test_kernels_LDFLAGS = $(OPENMP_CFLAGS)
tests_backend_test_kernels_softmax_SOURCES = tests/backend/test_kernels_softmax.c \
	tests/backend/test_kernels.h tests/harness/mt_test.h
tests_backend_test_kernels_softmax_LDFLAGS = $(OPENMP_CFLAGS)
tests_backend_test_kernels_layers_SOURCES = tests/backend/test_kernels_layers.c \
	tests/backend/test_kernels.h tests/harness/mt_test.h
tests_backend_test_kernels_layers_LDFLAGS = $(OPENMP_CFLAGS)
tests_backend_test_kernels_bf16_SOURCES = tests/backend/test_kernels_bf16.c tests/harness/mt_test.h
tests_backend_test_kernels_bf16_LDFLAGS = $(OPENMP_CFLAGS)
tests_backend_test_kernels_storage_SOURCES = tests/backend/test_kernels_storage.c \
	tests/harness/mt_test.h
tests_backend_test_kernels_window_SOURCES = tests/backend/test_kernels_window.c \
	tests/backend/test_kernels.h tests/harness/mt_test.h
tests_backend_test_kernels_window_LDFLAGS = $(OPENMP_CFLAGS)
TESTS += tests/backend/test_kernels tests/backend/test_kernels_softmax \
	tests/backend/test_kernels_layers tests/backend/test_kernels_bf16 \
	tests/backend/test_kernels_storage \
	tests/backend/test_kernels_window
