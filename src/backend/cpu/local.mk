# src/backend/cpu: the reference kernels, one file per op family; bf16
# storage on the CPU; the guarded table for tests of device discipline.
src_libmeshtrain_la_SOURCES += src/backend/cpu/kernels_cpu_internal.h src/backend/cpu/kernels_cpu.c \
	src/backend/cpu/kernels_cpu_norm.c src/backend/cpu/kernels_cpu_rope.c \
	src/backend/cpu/kernels_cpu_attention.c src/backend/cpu/kernels_cpu_attention_block.c \
	src/backend/cpu/kernels_cpu_tile.h src/backend/cpu/kernels_cpu_mlp.c \
	src/backend/cpu/kernels_cpu_loss.c src/backend/cpu/kernels_cpu_storage.c \
	src/backend/cpu/kernels_cpu_moe.c src/backend/cpu/kernels_cpu_guard.c
