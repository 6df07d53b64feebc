#!/usr/bin/env bash
# Does what experiment=local learns carry over to documents it never saw? For each seed: train experiment=local
# (16 steps), then score the base model (step 0) and the last step on heldout.jsonl (14 documents written for
# this, never trained on) with summrl.benchmark, split=all, 4 summaries each, the lexical judge. Then the gain.
# About 30 minutes a seed on 2 idle cores. Two documents in flight and a long timeout: with the default 8, the
# CPU endpoint takes longer than 120 s for some requests, and the client retries them (work thrown away).  SEEDS="0 1 2" OUT=runs/heldout_local bash experiments/heldout_local/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
seeds=${SEEDS:-"0 1"}
out=${OUT:-runs/heldout_local}
heldout="$PWD/experiments/heldout_local/heldout.jsonl"
for seed in $seeds; do
  run="$out/s$seed"
  python -m summrl.train experiment=local seed="$seed" run.name="heldout-s$seed" hydra.run.dir="$run"
  steps=$(python -c "import json; print(json.load(open('$run/result.json'))['steps'])")
  python -m summrl.benchmark experiment=local judge=lexical "dataset.files=[$heldout]" benchmark.split=all \
    benchmark.run_dir="$run" "benchmark.steps=[0,$steps]" benchmark.rollouts_per_doc=4 'benchmark.models=[]' \
    benchmark.max_concurrency=2 benchmark.timeout_s=1800 \
    benchmark.name="heldout-s$seed" hydra.run.dir="$run/heldout"
done
python experiments/heldout_local/gain.py "$out"/s*/heldout/rows.csv
