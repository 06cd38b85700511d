# src/schedule: every pipeline schedule's per-rank action lists, and the
# simulator that checks and times them; no MPI.  meshtrain-plan reports
# its bubble.
src_libmeshtrain_la_SOURCES += src/schedule/pp_schedule.c src/schedule/pp_simulate.c \
	src/schedule/pp_buffers.c src/schedule/pp_sched_internal.h
pkginclude_HEADERS += src/schedule/mt_pp_schedule.h
