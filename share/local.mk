# share: example configs, the quick start's corpus, pkg-config and module
# files, the GPU packages script; jobscripts/ installs beside them.
configsdir = $(pkgdatadir)/configs
dist_configs_DATA = \
	share/configs/tiny.yaml \
	share/configs/llama3-8b-fsdp2-tp8.yaml \
	share/configs/llama3-70b-tp8-pp4.yaml \
	share/configs/moe-ep16.yaml \
	share/configs/long-context-cp8.yaml \
	share/configs/moe-tiny.yaml \
	share/configs/cp-tiny.yaml \
	share/configs/llama3.2-1b-fsdp2.yaml \
	share/configs/llama3.1-8b-fsdp2-tp4.yaml \
	share/configs/qwen3-14b-tp4-pp2.yaml \
	share/configs/llama3.1-405b-tp8-pp8.yaml \
	share/configs/olmoe-1b-7b-ep8.yaml \
	share/configs/qwen3-30b-a3b-ep8.yaml \
	share/configs/qwen3-235b-a22b-pp8-ep8.yaml \
	share/configs/llama3.1-8b-128k-cp8.yaml \
	share/configs/qwen3-8b-by-name.yaml \
	share/configs/llama3-8b-from-config.yaml

jobscriptsdir = $(pkgdatadir)/jobscripts
dist_jobscripts_DATA = \
	jobscripts/dry-run.sbatch \
	jobscripts/meshtrain-job.sh \
	jobscripts/meshtrain-bind.sh \
	jobscripts/dense-8b-fsdp2-tp8.sbatch \
	jobscripts/dense-70b-tp8-pp4.sbatch \
	jobscripts/moe-ep16.sbatch \
	jobscripts/long-context-cp8.sbatch

# The quick start's corpus: the text ships; the token file is made in the
# build tree (VPATH builds and distcheck have a read-only srcdir) by the
# meshtrain-data just built.  Both install under $(pkgdatadir)/data.
corpusdir = $(pkgdatadir)/data
dist_corpus_DATA = share/data/tiny-corpus.txt
nodist_corpus_DATA = share/data/tiny-corpus.bin
CLEANFILES += share/data/tiny-corpus.bin
share/data/tiny-corpus.bin: $(srcdir)/share/data/tiny-corpus.txt apps/meshtrain-data$(EXEEXT)
	$(AM_V_GEN)$(MKDIR_P) share/data && \
	apps/meshtrain-data$(EXEEXT) --output $@ $(srcdir)/share/data/tiny-corpus.txt >/dev/null

# meshtrain.pc and the module files are written at install time, so that
# they name the directories actually installed into (`make install
# prefix=...` included).  Module files: `module use $(modulefilesdir)` then
# `module load meshtrain`.  meshtrain/$(VERSION).lua for Lmod and
# meshtrain/$(VERSION) (Tcl) for Environment Modules sit side by side:
# Lmod prefers the .lua, and Environment Modules lists only files that
# start with #%Module.
pkgconfigdir = $(libdir)/pkgconfig
modulefilesdir = $(datadir)/modulefiles
EXTRA_DIST += share/meshtrain.pc.in share/modulefiles/meshtrain.lua.in \
	share/modulefiles/meshtrain.tcl.in share/install-deps.sh share/fetch-gpu-debs.sh
# [@] keeps config.status from substituting the patterns themselves.
mt_module_subst = sed -e 's|@VERSION[@]|$(VERSION)|g' -e 's|@prefix[@]|$(prefix)|g' \
	-e 's|@bindir[@]|$(bindir)|g' -e 's|@libdir[@]|$(libdir)|g' -e 's|@mandir[@]|$(mandir)|g' \
	-e 's|@pkgdatadir[@]|$(pkgdatadir)|g' -e 's|@docdir[@]|$(docdir)|g' \
	-e 's|@modulefilesdir[@]|$(modulefilesdir)|g'
install-data-local:
	$(MKDIR_P) '$(DESTDIR)$(pkgconfigdir)'
	$(mt_module_subst) -e 's|@exec_prefix[@]|$(exec_prefix)|g' \
		-e 's|@includedir[@]|$(includedir)|g' -e 's|@PACKAGE_VERSION[@]|$(PACKAGE_VERSION)|g' \
		-e 's|@HDF5_LIBS[@]|$(HDF5_LIBS)|g' -e 's|@BLAS_LIBS[@]|$(BLAS_LIBS)|g' \
		$(srcdir)/share/meshtrain.pc.in > '$(DESTDIR)$(pkgconfigdir)/meshtrain.pc'
	$(MKDIR_P) '$(DESTDIR)$(modulefilesdir)/meshtrain'
	$(mt_module_subst) $(srcdir)/share/modulefiles/meshtrain.lua.in \
		> '$(DESTDIR)$(modulefilesdir)/meshtrain/$(VERSION).lua'
	$(mt_module_subst) $(srcdir)/share/modulefiles/meshtrain.tcl.in \
		> '$(DESTDIR)$(modulefilesdir)/meshtrain/$(VERSION)'
uninstall-local:
	rm -f '$(DESTDIR)$(pkgconfigdir)/meshtrain.pc'
	rm -f '$(DESTDIR)$(modulefilesdir)/meshtrain/$(VERSION).lua' \
		'$(DESTDIR)$(modulefilesdir)/meshtrain/$(VERSION)'
