# tests/hpc: the jobscripts under a private Slurm, requeue on pre-emption,
# the module files under Lmod and Environment Modules
MT_HPC_TESTS = tests/hpc/slurm_jobs.sh tests/hpc/slurm_requeue.sh tests/hpc/modulefiles.sh
TESTS += $(MT_HPC_TESTS)
EXTRA_DIST += $(MT_HPC_TESTS) tests/hpc/slurm-cluster.sh
# tests/hpc/modulefiles.sh installs into its own directory with $(MAKE).
AM_TESTS_ENVIRONMENT += MAKE='$(MAKE)'; export MAKE;
