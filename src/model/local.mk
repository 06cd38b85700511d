# src/model: the single-device model (dense and MoE), its arena, its RoPE table, AdamW.
src_libmeshtrain_la_SOURCES += src/model/model.c src/model/model_arena.c src/model/model_lora.c src/model/model_lora.h src/model/model_init.c \
	src/model/model_moe.h src/model/model_moe_internal.h src/model/model_moe.c \
	src/model/model_moe_state.c src/model/model_qknorm.h src/model/model_qknorm.c \
	src/model/model_rope.h src/model/model_rope.c src/model/optim.c \
	src/model/model_decode.c src/model/sample.c
pkginclude_HEADERS += src/model/mt_model.h src/model/mt_optim.h src/model/mt_decode.h
