# src/tokenizer: text to token ids and back (byte-level; Hugging Face tokenizer.json).
src_libmeshtrain_la_SOURCES += src/tokenizer/tokenizer.c src/tokenizer/tokenizer_buf.c \
	src/tokenizer/tokenizer_internal.h \
	src/tokenizer/tokenizer_hf.h src/tokenizer/tokenizer_hf_util.c src/tokenizer/tokenizer_hf_load.c \
	src/tokenizer/tokenizer_hf_config.c src/tokenizer/tokenizer_hf_norm.c \
	src/tokenizer/tokenizer_hf_pretok.c src/tokenizer/tokenizer_hf_bpe.c \
	src/tokenizer/tokenizer_hf_encode.c src/tokenizer/tokenizer_hf_decode.c
pkginclude_HEADERS += src/tokenizer/mt_tokenizer.h
