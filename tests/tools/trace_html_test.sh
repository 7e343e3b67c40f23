#!/usr/bin/env bash
# loom-trace's HTML page rendered by headless Chromium: the page's script ran
# and drew one heatmap cell per rank and operation (with the missing one marked),
# and the straggler table names the late rank first. Skips (77) without Chromium.
#   trace_html_test.sh LOOM_TRACE_BINARY FIXTURE_DIR
set -u
tool=$1
data=$2
browser=""
for b in chromium chromium-browser google-chrome; do
  if command -v "$b" >/dev/null 2>&1; then
    browser=$(command -v "$b")
    break
  fi
done
if [ -z "$browser" ]; then
  echo "SKIP: no chromium on PATH; the page's rendering is not checked"
  exit 77
fi
. "$(dirname "$0")/trace_test_lib.sh"

# render FIXTURE: writes $work/FIXTURE.html and the DOM after its scripts ran.
render() {
  "$tool" "$data/$1" --html "$work/$1.html" >/dev/null 2>&1
  mkdir -p "$work/profile-$1"
  timeout 90 "$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$work/profile-$1" --virtual-time-budget=5000 \
    --dump-dom "file://$work/$1.html" >"$work/$1.dom" 2>"$work/$1.err"
  if [ ! -s "$work/$1.dom" ]; then
    fail "$1: chromium gave no DOM:"
    tail -20 "$work/$1.err"
  fi
}

count() { grep -o "$1" "$2" | wc -l; }

# 4 ranks x 30 operations; rank 3 is the straggler.
render straggler
[ "$(count 'data-rendered="1"' "$work/straggler.dom")" -eq 1 ] ||
  fail "straggler: the page's script did not finish"
cells=$(count 'class="cell"' "$work/straggler.dom")
[ "$cells" -eq 120 ] || fail "straggler: $cells heatmap cells, expected 4 x 30"
# The cells are inside the element with id "heatmap".
inside=$(sed -n 's/.*<div class="heatmap" id="heatmap"[^>]*>\(.*\)/\1/p' "$work/straggler.dom" |
  grep -o 'class="cell"' | wc -l)
[ "$inside" -eq 120 ] || fail "straggler: $inside cells inside #heatmap, expected 120"
[ "$(count 'data-rank="3" data-seq="30"' "$work/straggler.dom")" -eq 1 ] ||
  fail "straggler: no cell for rank 3, seq 30"
grep -q 'title="rank 3, seq 3 allreduce: 5\.[0-9]* ms late (last)"' "$work/straggler.dom" ||
  fail "straggler: rank 3's late cell has no hover title"
# Coloured by lateness: on-time and late cells differ (Chromium writes the colours as rgb()).
colours=$(grep -o 'data-state="timed"[^>]*style="background: rgb([0-9, ]*)' "$work/straggler.dom" |
  sed 's/.*background: //' | sort -u | wc -l)
[ "$colours" -ge 3 ] || fail "straggler: cells have $colours colours, expected a scale"
grep -q '<tr data-rank="3" class="top"><td>3</td>' "$work/straggler.dom" ||
  fail "straggler: the table does not put rank 3 first"

# 3 ranks x 8 operations; rank 1 never entered seq 8.
render missing
cells=$(count 'class="cell"' "$work/missing.dom")
[ "$cells" -eq 24 ] || fail "missing: $cells heatmap cells, expected 3 x 8"
[ "$(count 'data-state="missing"' "$work/missing.dom")" -eq 1 ] ||
  fail "missing: expected exactly one cell marked missing"
grep -q 'missing ranks: {1}' "$work/missing.dom" || fail "missing: finding not on the page"

finish
