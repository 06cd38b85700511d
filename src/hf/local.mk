# src/hf: Hugging Face interchange (meshtrain-ckpt export and import, models
# by name and their weights at start):
# safetensors and config.json, collective over MPI; the JSON parsed by
# jansson (hf_json.c sets its strictness).
src_libmeshtrain_la_SOURCES += src/hf/hf_json.c src/hf/safetensors.c src/hf/hf_config.c \
	src/hf/hf_config_out.c src/hf/hf_source.c src/hf/hf_resolve.c src/hf/hf_load.c \
	src/hf/hf_export.c src/hf/hf_consolidate.c src/hf/hf_import.c src/hf/hf_cli.c src/hf/hf_peft.c \
	src/hf/hf_internal.h
pkginclude_HEADERS += src/hf/mt_hf.h
