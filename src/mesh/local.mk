# src/mesh: the device mesh over MPI.
src_libmeshtrain_la_SOURCES += src/mesh/mesh_layout.c src/mesh/mesh.c
pkginclude_HEADERS += src/mesh/mt_mesh.h
