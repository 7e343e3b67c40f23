#!/usr/bin/env bash
# Checks that every C, C++ and CUDA file of the project matches .clang-format (clang-format 14,
# Debian 12's); prints the files that do not and exits 1. --fix rewrites them instead.
set -euo pipefail
cd "$(dirname "$0")/.."
fmt=${CLANG_FORMAT:-clang-format-14}
command -v "$fmt" >/dev/null || { echo "check_format.sh: $fmt not found (scripts/setup.sh installs it)" >&2; exit 1; }
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.cc' '*.h' '*.c' '*.cu' '*.cuh')
else
  mapfile -t files < <(find . -path ./build\* -prune -o -path ./.venv -prune -o \
                         \( -name '*.cc' -o -name '*.h' -o -name '*.c' -o -name '*.cu' -o -name '*.cuh' \) -print)
fi
if [ "${1:-}" = --fix ]; then
  "$fmt" -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  "$fmt" --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "check_format.sh: ${#bad[@]} file(s) do not match .clang-format (scripts/check_format.sh --fix):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "check_format.sh: ${#files[@]} files match .clang-format"
