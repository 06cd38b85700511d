# tests/model: gradients against finite differences (dense and MoE), bf16
# storage at the rounding table's bits, the mixed-precision rule at every
# kernel call (1 and 2 ranks), device discipline on the guarded backend;
# sliding-window bounds; the RoPE tables against transformers' formulas
# (rope_tables.py) and in the model; KV-cache decoding against the full forward, sampling
check_PROGRAMS += tests/model/test_model tests/model/test_model_storage \
	tests/model/test_bf16_values tests/model/test_moe tests/model/test_device_discipline \
	tests/model/test_model_window tests/model/test_rope_tables tests/model/test_decode
tests_model_test_model_SOURCES = tests/model/test_model.c tests/harness/mt_test.h \
	tests/harness/mt_test_model.h
tests_model_test_model_storage_SOURCES = tests/model/test_model_storage.c tests/harness/mt_test.h \
	tests/harness/mt_test_model.h
tests_model_test_bf16_values_SOURCES = tests/model/test_bf16_values.c tests/harness/mt_test.h \
	tests/harness/mt_test_model.h
tests_model_test_moe_SOURCES = tests/model/test_moe.c tests/harness/mt_test.h \
	tests/harness/mt_test_model.h
tests_model_test_device_discipline_SOURCES = tests/model/test_device_discipline.c \
	tests/harness/mt_test.h tests/harness/mt_test_model.h
tests_model_test_model_window_SOURCES = tests/model/test_model_window.c \
	tests/harness/mt_test.h tests/harness/mt_test_model.h
tests_model_test_rope_tables_SOURCES = tests/model/test_rope_tables.c tests/harness/mt_test.h \
	tests/harness/mt_test_model.h
tests_model_test_decode_SOURCES = tests/model/test_decode.c tests/harness/mt_test.h \
	tests/harness/mt_test_model.h
MT_MODEL_SPECS = tests/model/bf16-values-np1.mpi tests/model/bf16-values-np2.mpi
TESTS += tests/model/test_model tests/model/test_model_storage tests/model/test_moe \
	tests/model/test_device_discipline tests/model/test_model_window tests/model/test_rope_tables \
	tests/model/test_decode tests/model/rope_tables.sh $(MT_MODEL_SPECS)
EXTRA_DIST += $(MT_MODEL_SPECS) tests/model/rope_tables.sh tests/model/rope_tables.py
