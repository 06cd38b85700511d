# src/parallel: ddp, fsdp, ring attention, MoE dispatch, the pipeline
# executor and its links.
src_libmeshtrain_la_SOURCES += src/parallel/ddp.c src/parallel/fsdp.c src/parallel/fsdp_internal.h \
	src/parallel/fsdp_layout.c src/parallel/ring_attention.c src/parallel/moe_dispatch.h \
	src/parallel/moe_dispatch.c src/parallel/moe_layout.h src/parallel/moe_layout.c src/parallel/pp_exec.c \
	src/parallel/pp_link.h src/parallel/pp_link.c
pkginclude_HEADERS += src/parallel/mt_ddp.h src/parallel/mt_fsdp.h src/parallel/mt_pp_exec.h \
	src/parallel/mt_ring_attention.h
