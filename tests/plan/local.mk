# tests/plan: the estimates, and meshtrain-plan's command line
check_PROGRAMS += tests/plan/test_plan
tests_plan_test_plan_SOURCES = tests/plan/test_plan.c tests/harness/mt_test.h
TESTS += tests/plan/test_plan tests/plan/plan_cli.sh
EXTRA_DIST += tests/plan/plan_cli.sh
