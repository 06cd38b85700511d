# tests/app: every program's --help against its man page, meshtrain-plot;
# meshtrain-generate against a float64 reference, its arguments and sampling;
# the training log's samples
MT_APP_TESTS = tests/app/man_help.sh tests/app/plot.sh tests/app/generate.sh \
	tests/app/generate_args.sh tests/app/generate_sample.sh
TESTS += $(MT_APP_TESTS)
EXTRA_DIST += $(MT_APP_TESTS) tests/app/generate_ref.py
