# src/comm: collectives on backend memory (host staging), bf16 messages,
# the tensor-parallel collectives, NCCL communicators (with CUDA and NCCL).
src_libmeshtrain_la_SOURCES += src/comm/mt_stage.h src/comm/stage.c src/comm/comm_bf16.c \
	src/comm/mt_tp_comm.h src/comm/tp_comm.c
pkginclude_HEADERS += src/comm/mt_comm_bf16.h
EXTRA_DIST += src/comm/nccl_comm.c src/comm/mt_nccl.h
if HAVE_CUDA
if HAVE_NCCL
AM_CPPFLAGS += $(NCCL_CFLAGS)
src_libmeshtrain_la_SOURCES += src/comm/nccl_comm.c src/comm/mt_nccl.h
pkginclude_HEADERS += src/comm/mt_nccl.h
src_libmeshtrain_la_LIBADD += $(NCCL_LIBS)
endif
endif
