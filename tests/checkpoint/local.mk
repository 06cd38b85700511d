# tests/checkpoint: write, read and reshard on 1 and 4 ranks, the file as
# h5dump sees it, meshtrain-ckpt's inspection commands
check_PROGRAMS += tests/checkpoint/test_checkpoint
tests_checkpoint_test_checkpoint_SOURCES = tests/checkpoint/test_checkpoint.c \
	tests/checkpoint/test_checkpoint_blocks.c tests/checkpoint/test_checkpoint_sha256.c \
	tests/checkpoint/test_checkpoint.h tests/harness/mt_test.h
# the test also opens files with plain serial HDF5 calls
tests_checkpoint_test_checkpoint_LDADD = $(LDADD) $(HDF5_LIBS)
# writes hostile variants of a checkpoint for ckpt_hostile.sh
check_PROGRAMS += tests/checkpoint/ckpt_craft
tests_checkpoint_ckpt_craft_SOURCES = tests/checkpoint/ckpt_craft.c
tests_checkpoint_ckpt_craft_LDADD = $(HDF5_LIBS)
MT_CHECKPOINT_TESTS = tests/checkpoint/checkpoint-np1.mpi tests/checkpoint/checkpoint-np4.mpi \
	tests/checkpoint/checkpoint_h5dump.sh tests/checkpoint/ckpt_tool.sh \
	tests/checkpoint/latest_fail.sh \
	tests/checkpoint/ckpt_hostile.sh tests/checkpoint/ckpt_lock.sh
TESTS += $(MT_CHECKPOINT_TESTS)
EXTRA_DIST += $(MT_CHECKPOINT_TESTS)
