# src/app: the command-line front ends the mains in apps/ call.
src_libmeshtrain_la_SOURCES += src/app/app.c src/app/plan_cli.c src/app/ckpt_tool.c src/app/data_cli.c \
	src/app/generate_cli.c
pkginclude_HEADERS += src/app/mt_app.h src/app/mt_ckpt_cli.h src/app/mt_data_cli.h
