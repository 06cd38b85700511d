# tests/layout: the layers of doc/architecture.md, no file cycles
TESTS += tests/layout/layering.sh
EXTRA_DIST += tests/layout/layering.sh tests/layout/deps.py
