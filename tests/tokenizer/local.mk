# tests/tokenizer: the tokenizer handle and its tokenizers: the byte one;
# the pieces of the Hugging Face pipeline (test_tokenizer_hf_parts) and
# small tokenizer.json files through the API (test_tokenizer_hf); real
# tokenizers against tokenizers.js under node (tok_reference.sh, with the
# driver tok_encode, which bench-tokenizer also runs)
check_PROGRAMS += tests/tokenizer/test_tokenizer_byte tests/tokenizer/test_tokenizer_hf_parts \
	tests/tokenizer/test_tokenizer_hf tests/tokenizer/tok_encode
tests_tokenizer_test_tokenizer_byte_SOURCES = tests/tokenizer/test_tokenizer_byte.c tests/harness/mt_test.h
tests_tokenizer_test_tokenizer_hf_parts_SOURCES = tests/tokenizer/test_tokenizer_hf_parts.c \
	tests/harness/mt_test.h
tests_tokenizer_test_tokenizer_hf_parts_LDADD = $(LDADD) $(JANSSON_LIBS)
tests_tokenizer_test_tokenizer_hf_SOURCES = tests/tokenizer/test_tokenizer_hf.c tests/harness/mt_test.h
tests_tokenizer_test_tokenizer_hf_LDADD = $(LDADD) -lpthread
tests_tokenizer_tok_encode_SOURCES = tests/tokenizer/tok_encode.c
TESTS += tests/tokenizer/test_tokenizer_byte tests/tokenizer/test_tokenizer_hf_parts \
	tests/tokenizer/test_tokenizer_hf tests/tokenizer/tok_reference.sh
EXTRA_DIST += tests/tokenizer/tok_reference.sh tests/tokenizer/tok_reference.mjs tests/tokenizer/corpus
