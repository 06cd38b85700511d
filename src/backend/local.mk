# src/backend: the kernel table every backend fills, and its profiling
# wrapper.
src_libmeshtrain_la_SOURCES += src/backend/kernels_profile.c src/backend/backend_entries.def \
	src/backend/backend_require.h
pkginclude_HEADERS += src/backend/mt_backend.h
