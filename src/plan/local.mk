# src/plan: memory, communication and bubble estimates, and their reports.
src_libmeshtrain_la_SOURCES += src/plan/plan.c src/plan/plan_report.c
pkginclude_HEADERS += src/plan/mt_plan.h
