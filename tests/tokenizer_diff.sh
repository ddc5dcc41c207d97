#!/bin/sh
# tokenizer_diff.sh: differential test of the tokenizer against Python's Hugging Face
# `tokenizers` (tests/tokenizer_diff.py) on every tokenizer under $TPINFER_SHARED.
# Exits 77 (skip) when python3, the tokenizers package, the driver or the shared dir is missing.
top_builddir=${top_builddir:-.}
top_srcdir=${top_srcdir:-.}
TPINFER_SHARED=${TPINFER_SHARED:-../shared}
PYTHON3=${PYTHON3:-python3}
driver="$top_builddir/tests/tokenizer_driver"

if ! command -v "$PYTHON3" >/dev/null 2>&1; then
    echo "SKIP: $PYTHON3 not found (set PYTHON3)"
    exit 77
fi
if ! "$PYTHON3" -c 'import tokenizers' >/dev/null 2>&1; then
    echo "SKIP: the Python package 'tokenizers' is missing ($PYTHON3 -m pip install tokenizers)"
    exit 77
fi
if [ ! -x "$driver" ]; then
    echo "SKIP: $driver is not built"
    exit 77
fi
if [ ! -d "$TPINFER_SHARED" ]; then
    echo "SKIP: shared fixtures not found at $TPINFER_SHARED (set TPINFER_SHARED)"
    exit 77
fi
exec "$PYTHON3" "$top_srcdir/tests/tokenizer_diff.py" "$driver" "$TPINFER_SHARED" ${TOKENIZER_DIFF_ARGS:-}
