# fuzz/: libFuzzer targets, built only under --enable-fuzzing (clang).
# make check runs each briefly over its seed corpus; make fuzz runs each for
# FUZZ_SECONDS (default 900).
FUZZ_TARGETS = fuzz/fuzz_config fuzz/fuzz_hf_config fuzz/fuzz_safetensors fuzz/fuzz_data_llmc
EXTRA_DIST += fuzz/fuzz_util.h fuzz/run-fuzz fuzz/corpus
FUZZ_SECONDS = 900
if ENABLE_FUZZING
check_PROGRAMS += $(FUZZ_TARGETS)
fuzz_fuzz_config_SOURCES = fuzz/fuzz_config.c
fuzz_fuzz_hf_config_SOURCES = fuzz/fuzz_hf_config.c
fuzz_fuzz_safetensors_SOURCES = fuzz/fuzz_safetensors.c
fuzz_fuzz_data_llmc_SOURCES = fuzz/fuzz_data_llmc.c
fuzz_fuzz_config_LDFLAGS = -fsanitize=fuzzer
fuzz_fuzz_hf_config_LDFLAGS = -fsanitize=fuzzer
fuzz_fuzz_hf_config_LDADD = $(LDADD) $(JANSSON_LIBS)
fuzz_fuzz_safetensors_LDFLAGS = -fsanitize=fuzzer
fuzz_fuzz_data_llmc_LDFLAGS = -fsanitize=fuzzer
TESTS += fuzz/run-fuzz
fuzz: $(FUZZ_TARGETS)
	FUZZ_SECONDS=$(FUZZ_SECONDS) $(top_srcdir)/fuzz/run-fuzz long
.PHONY: fuzz
endif
