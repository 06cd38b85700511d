# doc: the manual pages and the Markdown documentation, installed under
# $(docdir); the bf16-storage audit ships in the tarball only.
dist_man1_MANS = \
	doc/man/meshtrain-dense.1 \
	doc/man/meshtrain-moe.1 \
	doc/man/meshtrain-cp.1 \
	doc/man/meshtrain-plan.1 \
	doc/man/meshtrain-data.1 \
	doc/man/meshtrain-ckpt.1 \
	doc/man/meshtrain-generate.1 \
	doc/man/meshtrain-plot.1
dist_doc_DATA += README.md NEWS LICENSE \
	doc/architecture.md \
	doc/automodel-recipes.md \
	doc/checkpoints.md \
	doc/config-reference.md \
	doc/context-parallel.md \
	doc/data.md \
	doc/generate.md \
	doc/errors.md \
	doc/gpu.md \
	doc/hf-interchange.md \
	doc/hf-models.md \
	doc/hf-reference.md \
	doc/lora.md \
	doc/jobscripts.md \
	doc/kernels.md \
	doc/mesh.md \
	doc/mixed-precision.md \
	doc/moe.md \
	doc/performance.md \
	doc/pipeline.md \
	doc/plan.md \
	doc/rope-scaling.md \
	doc/testing.md \
	doc/fuzzing.md \
	doc/sliding-window.md \
	doc/tokenizer.md \
	doc/training.md \
	doc/user-guide.md \
	doc/validation.md
EXTRA_DIST += doc/bf16-storage-audit.md
