# tests/comm: bf16 messages and their use in fsdp on 2, 3 and 4 ranks, the
# wire dtype of every strategy, the NCCL layer on one rank (with NCCL)
check_PROGRAMS += tests/comm/test_comm_bf16
tests_comm_test_comm_bf16_SOURCES = tests/comm/test_comm_bf16.c tests/harness/mt_test.h \
	tests/harness/mt_test_model.h
MT_COMM_TESTS = tests/comm/comm-bf16-np2.mpi tests/comm/comm-bf16-np3.mpi \
	tests/comm/comm-bf16-np4.mpi tests/comm/comm_dtype.sh
TESTS += $(MT_COMM_TESTS)
EXTRA_DIST += $(MT_COMM_TESTS) tests/comm/test_nccl.c tests/comm/nccl-np1.mpi
if HAVE_CUDA
if HAVE_NCCL
check_PROGRAMS += tests/comm/test_nccl
tests_comm_test_nccl_SOURCES = tests/comm/test_nccl.c tests/harness/mt_test.h
TESTS += tests/comm/nccl-np1.mpi
endif
endif
