#!/usr/bin/env bash
# README.md's table of environment variables must be what loom-env prints
# from the one table in src/util/env.cc.
set -euo pipefail
loom_env=$1
readme=$2
want=$("$loom_env")
got=$(sed -n '/<!-- env-table begin -->/,/<!-- env-table end -->/p' "$readme" | sed '1d;$d')
if [ "$want" != "$got" ]; then
  echo "README.md's variable table is stale; regenerate it with: build/loom-env"
  diff <(echo "$want") <(echo "$got") || true
  exit 1
fi
echo "README table matches src/util/env.cc ($(echo "$want" | wc -l) lines)"
