#!/usr/bin/env bash
# Prints the git tree id of the working tree as it stands: tracked and untracked files that git
# does not ignore, committed or not. The same files give the same id on any machine whatever its
# HEAD, so a GPU machine that receives a copy of this working tree (with the .git of an older
# commit) can tell that a carried .device-bundle/ was built from exactly these sources.
set -euo pipefail
cd "$(dirname "$0")/.."
index=$(mktemp)
trap 'rm -f "$index"' EXIT
rm -f "$index"  # git add wants an absent index or a valid one
GIT_INDEX_FILE="$index" git add -A
GIT_INDEX_FILE="$index" git write-tree
