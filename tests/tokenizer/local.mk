# tests/tokenizer: the tokenizer handle and its tokenizers
check_PROGRAMS += tests/tokenizer/test_tokenizer_byte
tests_tokenizer_test_tokenizer_byte_SOURCES = tests/tokenizer/test_tokenizer_byte.c tests/harness/mt_test.h
TESTS += tests/tokenizer/test_tokenizer_byte
check_PROGRAMS += tests/tokenizer/tok_encode
tests_tokenizer_tok_encode_SOURCES = tests/tokenizer/tok_encode.c
TESTS += tests/tokenizer/tok_reference.sh
EXTRA_DIST += tests/tokenizer/tok_reference.sh tests/tokenizer/tok_reference.mjs tests/tokenizer/corpus
check_PROGRAMS += tests/tokenizer/test_tokenizer_hf_parts
tests_tokenizer_test_tokenizer_hf_parts_SOURCES = tests/tokenizer/test_tokenizer_hf_parts.c \
	tests/harness/mt_test.h
tests_tokenizer_test_tokenizer_hf_parts_LDADD = $(LDADD) $(JANSSON_LIBS)
TESTS += tests/tokenizer/test_tokenizer_hf_parts
check_PROGRAMS += tests/tokenizer/test_tokenizer_hf
tests_tokenizer_test_tokenizer_hf_SOURCES = tests/tokenizer/test_tokenizer_hf.c tests/harness/mt_test.h
tests_tokenizer_test_tokenizer_hf_LDADD = $(LDADD) -lpthread
TESTS += tests/tokenizer/test_tokenizer_hf
