# src/core: status codes and errors, MPI waiting, rng, clocks, bf16 bits,
# the memory pool's bookkeeping.
src_libmeshtrain_la_SOURCES += src/core/status.c src/core/comm.c src/core/rng.c src/core/pool.c \
	src/core/mt_bf16.h src/core/mt_clock.h src/core/mt_pool.h
pkginclude_HEADERS += src/core/mt_status.h src/core/mt_comm.h src/core/mt_rng.h
