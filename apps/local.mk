# apps: the mains, a few lines each over src/app.
bin_PROGRAMS += apps/meshtrain-dense apps/meshtrain-moe apps/meshtrain-cp apps/meshtrain-plan \
	apps/meshtrain-data apps/meshtrain-ckpt apps/meshtrain-generate
apps_meshtrain_dense_SOURCES = apps/meshtrain-dense.c
apps_meshtrain_moe_SOURCES = apps/meshtrain-moe.c
apps_meshtrain_cp_SOURCES = apps/meshtrain-cp.c
apps_meshtrain_plan_SOURCES = apps/meshtrain-plan.c
apps_meshtrain_data_SOURCES = apps/meshtrain-data.c
apps_meshtrain_ckpt_SOURCES = apps/meshtrain-ckpt.c
apps_meshtrain_generate_SOURCES = apps/meshtrain-generate.c
dist_bin_SCRIPTS = apps/meshtrain-plot
