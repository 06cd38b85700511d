# tests/hf: the JSON rules, export and import against an independent
# reader (hf_check.py), a training run's consolidated save (hf_same.py),
# loading a model by name at start (hf_load.sh)
check_PROGRAMS += tests/hf/test_json tests/hf/test_f16
tests_hf_test_json_SOURCES = tests/hf/test_json.c tests/harness/mt_test.h
tests_hf_test_json_LDADD = $(LDADD) $(JANSSON_LIBS)
tests_hf_test_f16_SOURCES = tests/hf/test_f16.c tests/harness/mt_test.h
tests_hf_test_f16_LDADD = $(LDADD) $(JANSSON_LIBS) -lm
# safetensors headers a hostile file could carry
check_PROGRAMS += tests/hf/test_st_hostile
tests_hf_test_st_hostile_SOURCES = tests/hf/test_st_hostile.c tests/harness/mt_test.h
tests_hf_test_st_hostile_LDADD = $(LDADD) $(JANSSON_LIBS)
TESTS += tests/hf/test_st_hostile
TESTS += tests/hf/test_json tests/hf/test_f16 tests/hf/hf_interchange.sh tests/hf/hf_consolidated.sh \
	tests/hf/hf_load.sh
EXTRA_DIST += tests/hf/hf_interchange.sh tests/hf/hf_check.py tests/hf/hf_consolidated.sh \
	tests/hf/hf_same.py tests/hf/hf_load.sh
# hf_families: each Hugging Face family against the float64 PyTorch
# reference (hf_reference.py, models from make_model.py)
TESTS += tests/hf/hf_families.sh
EXTRA_DIST += tests/hf/hf_families.sh tests/hf/hf_reference.py tests/hf/make_model.py
# hf_lora: LoRA fine-tuning against a float64 PyTorch reference, on 2 ranks,
# resumed, its PEFT export checked by a standard-library reader
TESTS += tests/hf/hf_lora.sh
EXTRA_DIST += tests/hf/hf_lora.sh tests/hf/lora_reference.py tests/hf/peft_check.py
