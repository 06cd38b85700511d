# tests/mesh: the mesh on 1, 2, 4 and 8 ranks
check_PROGRAMS += tests/mesh/test_mesh
tests_mesh_test_mesh_SOURCES = tests/mesh/test_mesh.c tests/harness/mt_test.h
MT_MESH_TESTS = tests/mesh/mesh-np1.mpi tests/mesh/mesh-np2.mpi tests/mesh/mesh-np4.mpi \
	tests/mesh/mesh-np8.mpi
TESTS += $(MT_MESH_TESTS)
EXTRA_DIST += $(MT_MESH_TESTS)
