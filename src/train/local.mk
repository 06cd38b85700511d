# src/train: one training run, from devices to the step loop, checkpoints
# and metrics.
src_libmeshtrain_la_SOURCES += src/train/train.c src/train/train_setup.h src/train/train_setup.c \
	src/train/train_ckpt.c src/train/train_internal.h \
	src/train/train_sample.c src/train/train_sample.h \
	src/train/train_mp.h src/train/train_mp.c src/train/train_device.h src/train/train_device.c \
	src/train/train_moe.h src/train/train_moe.c src/train/train_cp.c src/train/train_cp.h \
	src/train/train_lora.h src/train/train_lora.c
pkginclude_HEADERS += src/train/mt_train.h
