# tests/data: readers, sampling, packing, loss masks and blends, meshtrain-data
check_PROGRAMS += tests/data/test_data tests/data/test_pack tests/data/test_blend
tests_data_test_data_SOURCES = tests/data/test_data.c tests/harness/mt_test.h tests/harness/mt_test_dir.h
tests_data_test_pack_SOURCES = tests/data/test_pack.c tests/harness/mt_test.h
tests_data_test_blend_SOURCES = tests/data/test_blend.c tests/harness/mt_test.h tests/harness/mt_test_dir.h
MT_DATA_TOOL_TESTS = tests/data/data_tool.sh tests/data/data_tool_jsonl.sh \
	tests/data/data_tool_par.sh tests/data/data_tool_sft.sh tests/data/data_tool_bpe.sh \
	tests/data/data_tool_chat.sh
TESTS += tests/data/test_data tests/data/test_pack tests/data/test_blend $(MT_DATA_TOOL_TESTS)
EXTRA_DIST += $(MT_DATA_TOOL_TESTS) tests/data/mtread.py
