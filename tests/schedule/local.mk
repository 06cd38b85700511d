# tests/schedule: every schedule's action lists, checked and simulated
check_PROGRAMS += tests/schedule/test_pp_schedule
tests_schedule_test_pp_schedule_SOURCES = tests/schedule/test_pp_schedule.c tests/harness/mt_test.h
TESTS += tests/schedule/test_pp_schedule
