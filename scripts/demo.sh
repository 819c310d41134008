#!/usr/bin/env bash
# The main job on the shipped sample, end to end, from a fresh machine.
# Rerunning reuses what is already done.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
out="${LMDATA_DEMO_OUT:-runs/sample}"
mkdir -p "$out"
lm=.venv/bin/lmdata
if [ ! -f "$out/tokenizer/tokenizer.json" ]; then
  $lm tokenizer train data/sample.txt --vocab-size 4096 --special-token '<|endoftext|>' --out "$out/tokenizer"
fi
$lm tokenizer encode "$out/tokenizer" < data/sample.txt > "$out/sample.ids"
echo "demo: encoded data/sample.txt ($(wc -c < data/sample.txt) bytes) into $(wc -w < "$out/sample.ids") tokens -> $out/sample.ids"
