# src/config: the schema, YAML parsing, validation, broadcast, emission.
src_libmeshtrain_la_SOURCES += src/config/config_internal.h src/config/config_schema.c \
	src/config/config_yaml.c src/config/config_json_text.c src/config/config_validate.c \
	src/config/config_emit.c src/config/config_blend.c src/config/config_peft.c \
	src/config/config_diag.c src/config/config_yaml_internal.h src/config/config_automodel.c \
	src/config/config_automodel_recipe.c src/config/config_automodel_util.c
pkginclude_HEADERS += src/config/mt_config.h
