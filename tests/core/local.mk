# tests/core
check_PROGRAMS += tests/core/test_pool
tests_core_test_pool_SOURCES = tests/core/test_pool.c tests/harness/mt_test.h
TESTS += tests/core/test_pool
