# tests/parallel: ring attention against the dense kernels on 1, 2 and 4
# ranks, and every strategy and parallelism against the 1-rank run (a
# sliding window's too: window_parity.sh)
check_PROGRAMS += tests/parallel/test_ring_attention
tests_parallel_test_ring_attention_SOURCES = tests/parallel/test_ring_attention.c \
	tests/harness/mt_test.h
MT_PARALLEL_TESTS = tests/parallel/ring-attention-np1.mpi tests/parallel/ring-attention-np2.mpi \
	tests/parallel/ring-attention-np4.mpi tests/parallel/ddp_parity.sh \
	tests/parallel/fsdp_parity.sh tests/parallel/tp_parity.sh tests/parallel/cp_parity.sh \
	tests/parallel/pp_parity.sh tests/parallel/moe_parity.sh tests/parallel/moe_mesh.sh \
	tests/parallel/window_parity.sh tests/parallel/rope_parity.sh tests/parallel/bias_parity.sh \
	tests/parallel/moe_arch_parity.sh
TESTS += $(MT_PARALLEL_TESTS)
EXTRA_DIST += $(MT_PARALLEL_TESTS)
