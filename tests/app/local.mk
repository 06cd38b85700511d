# tests/app: every program's --help against its man page, meshtrain-plot
MT_APP_TESTS = tests/app/man_help.sh tests/app/plot.sh
TESTS += $(MT_APP_TESTS)
EXTRA_DIST += $(MT_APP_TESTS)
