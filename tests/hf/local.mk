# tests/hf: the JSON rules, export and import against an independent
# reader (hf_check.py), a training run's consolidated save (hf_same.py)
check_PROGRAMS += tests/hf/test_json tests/hf/test_f16
tests_hf_test_json_SOURCES = tests/hf/test_json.c tests/harness/mt_test.h
tests_hf_test_json_LDADD = $(LDADD) $(JANSSON_LIBS)
tests_hf_test_f16_SOURCES = tests/hf/test_f16.c tests/harness/mt_test.h
tests_hf_test_f16_LDADD = $(LDADD) $(JANSSON_LIBS) -lm
TESTS += tests/hf/test_json tests/hf/test_f16 tests/hf/hf_interchange.sh tests/hf/hf_consolidated.sh
EXTRA_DIST += tests/hf/hf_interchange.sh tests/hf/hf_check.py tests/hf/hf_consolidated.sh \
	tests/hf/hf_same.py
