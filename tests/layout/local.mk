# tests/layout: the layers of doc/architecture.md, no file cycles, the
# README's code tour, no issue numbers
TESTS += tests/layout/layering.sh tests/layout/tree.sh
EXTRA_DIST += tests/layout/layering.sh tests/layout/tree.sh tests/layout/deps.py
