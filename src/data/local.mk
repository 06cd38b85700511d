# src/data: token files, sampling, packing, the writers meshtrain-data uses.
src_libmeshtrain_la_SOURCES += src/data/data.c src/data/data_write.c src/data/pack.c \
	src/data/data_input.c src/data/data_sft.c src/data/data_par.c src/data/data_write_internal.h \
	src/data/data_mask.c src/data/data_parts.c src/data/data_blend.c
pkginclude_HEADERS += src/data/mt_data.h src/data/mt_pack.h src/data/mt_data_write.h src/data/mt_blend.h
