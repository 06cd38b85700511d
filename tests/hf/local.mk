# tests/hf: the JSON rules, export and import against an independent
# reader (hf_check.py), loading a model by name at start (hf_load.sh)
check_PROGRAMS += tests/hf/test_json
tests_hf_test_json_SOURCES = tests/hf/test_json.c tests/harness/mt_test.h
tests_hf_test_json_LDADD = $(LDADD) $(JANSSON_LIBS)
TESTS += tests/hf/test_json tests/hf/hf_interchange.sh tests/hf/hf_load.sh
EXTRA_DIST += tests/hf/hf_interchange.sh tests/hf/hf_check.py tests/hf/hf_load.sh
