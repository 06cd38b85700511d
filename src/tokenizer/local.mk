# src/tokenizer: text to token ids and back (byte-level; Hugging Face tokenizer.json).
src_libmeshtrain_la_SOURCES += src/tokenizer/tokenizer.c src/tokenizer/tokenizer_internal.h
pkginclude_HEADERS += src/tokenizer/mt_tokenizer.h
