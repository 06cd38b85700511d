# bench: the benchmarks, never part of make check (doc/performance.md).
# Each has an entry point bench/bench_<name>.{sh,c} and a target
# `make bench-<name>`; `make bench` is bench-dense.
#   bench-dense  meshtrain-dense against PyTorch eager, tokens/s and MFU
#   bench-comm   bytes per step against the ring volume, and the hidden
#                fraction of communication, for every data-parallel strategy
#                at 4 ranks (pmpi_count is a PMPI shim loaded with
#                LD_PRELOAD; comm_replay replays one step's collectives)
#   bench-moe    all-to-all bytes per step against the analytic volume, and
#                the share of the step in dispatch and combine
#   bench-pp     every schedule's measured idle share against the simulator
#   bench-cp     per-rank attention FLOPs, balanced against contiguous
#                sharding, and the ring's hidden transfers, at 2 and 4 ranks
#   bench-load   a 1B bf16 model loaded by name (the trainer's loader) on 1
#                and 2 ranks against cat of its files, warm page cache
#   bench-data   meshtrain-data's MB/s on a generated JSON Lines corpus, plain
#                and zstd, at 1 and 2 ranks
#   bench-lora   LoRA against full fine-tuning of one model: memory per rank
#                (measured and planned), peak RSS, step time
#   bench-tokenizer  Hugging Face tokenizer encode MB/s on one core against
#                tokenizers.js under node (Llama 3, Llama 2)
#   bench-cuda-gemm, bench-cuda-attention (bench-gpu: both): the bf16
#                cuBLASLt GEMM rate at Llama-1B shapes, and the attention
#                kernels at the 1B shape (with CUDA; tests/gpu/run.sh)
EXTRA_PROGRAMS += bench/sgemm_rate bench/comm_replay bench/bench_cp bench/bench_load
bench_sgemm_rate_SOURCES = bench/sgemm_rate.c
bench_comm_replay_SOURCES = bench/comm_replay.c
bench_bench_cp_SOURCES = bench/bench_cp.c
bench_bench_load_SOURCES = bench/bench_load.c
bench_bench_load_LDADD = $(LDADD) $(JANSSON_LIBS)
EXTRA_LTLIBRARIES = bench/pmpi_count.la
bench_pmpi_count_la_SOURCES = bench/pmpi_count.c
# -rpath: a shared object although it is never installed
bench_pmpi_count_la_LDFLAGS = -module -avoid-version -shared -rpath $(abs_builddir)/bench
bench_pmpi_count_la_LIBADD =
CLEANFILES += bench/sgemm_rate$(EXEEXT) bench/comm_replay$(EXEEXT) bench/pmpi_count.la \
	bench/bench_cp$(EXEEXT) bench/bench_load$(EXEEXT)
EXTRA_DIST += bench/bench_dense.sh bench/torch_llama.py bench/dense.yaml bench/bench_comm.sh \
	bench/bench_moe.sh bench/bench_pp.sh bench/bench_load.sh bench/bench_data.sh bench/bench_lora.sh \
	bench/bench_tokenizer.sh bench/bench_cuda_gemm.c bench/bench_cuda_attention.c
MT_BENCH_ENV = srcdir=$(srcdir) MPIEXEC='$(MPIEXEC)' MPIEXEC_NP='$(MPIEXEC_NP)'

bench: bench-dense
bench-dense: bench/sgemm_rate$(EXEEXT) apps/meshtrain-dense$(EXEEXT) share/data/tiny-corpus.bin
	$(MT_BENCH_ENV) $(SHELL) $(srcdir)/bench/bench_dense.sh
bench-comm: bench/pmpi_count.la bench/comm_replay$(EXEEXT) apps/meshtrain-dense$(EXEEXT) \
		apps/meshtrain-plan$(EXEEXT) share/data/tiny-corpus.bin
	$(MT_BENCH_ENV) $(SHELL) $(srcdir)/bench/bench_comm.sh
bench-moe: apps/meshtrain-moe$(EXEEXT) share/data/tiny-corpus.bin
	$(MT_BENCH_ENV) $(SHELL) $(srcdir)/bench/bench_moe.sh
bench-pp: apps/meshtrain-dense$(EXEEXT) share/data/tiny-corpus.bin
	$(MT_BENCH_ENV) NP=4 $(SHELL) $(srcdir)/bench/bench_pp.sh
bench-cp: bench/bench_cp$(EXEEXT)
	$(MPIEXEC) $(MPIEXEC_NP) 2 bench/bench_cp$(EXEEXT) 4096
	$(MPIEXEC) $(MPIEXEC_NP) 4 bench/bench_cp$(EXEEXT) 4096
bench-load: bench/bench_load$(EXEEXT)
	$(MT_BENCH_ENV) $(SHELL) $(srcdir)/bench/bench_load.sh
bench-data: apps/meshtrain-data$(EXEEXT)
	$(MT_BENCH_ENV) $(SHELL) $(srcdir)/bench/bench_data.sh
bench-lora: apps/meshtrain-dense$(EXEEXT) apps/meshtrain-ckpt$(EXEEXT) share/data/tiny-corpus.bin
	$(MT_BENCH_ENV) $(SHELL) $(srcdir)/bench/bench_lora.sh
bench-tokenizer: tests/tokenizer/tok_encode$(EXEEXT)
	$(MT_BENCH_ENV) $(SHELL) $(srcdir)/bench/bench_tokenizer.sh
clean-local: clean-bench
clean-bench:
	-rm -rf comm-bench moe-bench bench-load-cache bench-data lora-bench
.PHONY: bench bench-dense bench-comm bench-moe bench-pp bench-cp bench-load bench-data bench-lora \
	bench-tokenizer clean-bench

if HAVE_CUDA
EXTRA_PROGRAMS += bench/bench_cuda_gemm bench/bench_cuda_attention
bench_bench_cuda_gemm_SOURCES = bench/bench_cuda_gemm.c
bench_bench_cuda_attention_SOURCES = bench/bench_cuda_attention.c
CLEANFILES += bench/bench_cuda_gemm$(EXEEXT) bench/bench_cuda_attention$(EXEEXT)
bench-cuda-gemm: bench/bench_cuda_gemm$(EXEEXT)
	bench/bench_cuda_gemm$(EXEEXT)
bench-cuda-attention: bench/bench_cuda_attention$(EXEEXT)
	bench/bench_cuda_attention$(EXEEXT)
bench-gpu: bench-cuda-gemm bench-cuda-attention
endif
.PHONY: bench-cuda-gemm bench-cuda-attention bench-gpu
# AutoModel's recipes as shipped, through meshtrain-plan: make bench-recipes AUTOMODEL=DIR
EXTRA_DIST += bench/recipes.sh bench/recipes_cache.py
bench-recipes: apps/meshtrain-plan$(EXEEXT)
	@test -n "$(AUTOMODEL)" || { echo "set AUTOMODEL=DIR (a checkout of NVIDIA-NeMo/Automodel)"; exit 1; }
	$(SHELL) $(srcdir)/bench/recipes.sh "$(AUTOMODEL)" "$(abs_builddir)/apps/meshtrain-plan"
