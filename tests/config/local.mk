# tests/config: parsing, validation, the broadcast on 4 and 8 ranks, the
# refusal of bad configs on every rank, the reference doc, shipped configs
check_PROGRAMS += tests/config/test_config_parse tests/config/test_config_validate \
	tests/config/test_config_bcast
tests_config_test_config_parse_SOURCES = tests/config/test_config_parse.c tests/harness/mt_test.h
tests_config_test_config_validate_SOURCES = tests/config/test_config_validate.c \
	tests/harness/mt_test.h
tests_config_test_config_bcast_SOURCES = tests/config/test_config_bcast.c tests/harness/mt_test.h
MT_CONFIG_TESTS = tests/config/config-bcast-np4.mpi tests/config/config-bcast-np8.mpi \
	tests/config/config_abort.sh tests/config/doc_reference.sh tests/config/shipped_configs.sh
TESTS += tests/config/test_config_parse tests/config/test_config_validate $(MT_CONFIG_TESTS)
EXTRA_DIST += $(MT_CONFIG_TESTS)
# the resolved-config YAML reads back identical, control characters included
check_PROGRAMS += tests/config/test_config_emit
tests_config_test_config_emit_SOURCES = tests/config/test_config_emit.c tests/harness/mt_test.h
TESTS += tests/config/test_config_emit
# sizes whose products overflow int64 are refused by name
TESTS += tests/config/config_overflow.sh
EXTRA_DIST += tests/config/config_overflow.sh
# AutoModel recipes: mapped, ignored or refused with the one reason, table-driven
check_PROGRAMS += tests/config/test_config_automodel
tests_config_test_config_automodel_SOURCES = tests/config/test_config_automodel.c \
	tests/harness/mt_test.h
TESTS += tests/config/test_config_automodel
# an AutoModel recipe trains on 2 ranks with AutoModel's meaning; refusals by the trainer
TESTS += tests/config/recipe_train.sh
EXTRA_DIST += tests/config/recipe_train.sh
