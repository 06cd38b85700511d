# src/checkpoint: HDF5 checkpoints, the SHA-256 manifest, and
# meshtrain-ckpt's inspection commands (list, verify, config, steps; no
# MPI launch).
src_libmeshtrain_la_SOURCES += src/checkpoint/checkpoint_digest.c \
	src/checkpoint/checkpoint_internal.h src/checkpoint/checkpoint.c \
	src/checkpoint/checkpoint_dir.c src/checkpoint/checkpoint_lock.c src/checkpoint/checkpoint_io.c src/checkpoint/checkpoint_h5.c \
	src/checkpoint/checkpoint_plan.c src/checkpoint/ckpt_cli.c src/checkpoint/ckpt_inspect.c \
	src/checkpoint/ckpt_cli_internal.h
pkginclude_HEADERS += src/checkpoint/mt_checkpoint.h
