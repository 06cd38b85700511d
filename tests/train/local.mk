# tests/train: resume bit for bit, mixed precision, device discipline of
# the whole trainer, packed sequences
MT_TRAIN_TESTS = tests/train/train_resume.sh tests/train/mixed_precision.sh \
	tests/train/device_guard.sh tests/train/packing.sh \
	tests/train/nonfinite.sh
TESTS += $(MT_TRAIN_TESTS)
EXTRA_DIST += $(MT_TRAIN_TESTS)
# per-token loss masks on every mesh, against a float64 reference; blends
# and dataset.paths (the helper writes masks and token files)
TESTS += tests/train/loss_mask.sh tests/train/blend.sh
EXTRA_DIST += tests/train/loss_mask.sh tests/train/blend.sh tests/train/lossmask.py
# metrics.jsonl stays JSON when the loss goes non-finite
TESTS += tests/train/metrics_nonfinite.sh
EXTRA_DIST += tests/train/metrics_nonfinite.sh
# a token file rewritten or truncated under a running job stops it cleanly
TESTS += tests/train/data_changed.sh
EXTRA_DIST += tests/train/data_changed.sh
