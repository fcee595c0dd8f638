#!/usr/bin/env bash
# Before/after of every tuner on one model (default: the bundled organism), the numbers behind
# figures/organism/: SEAL-H, SEAL-C, LoRA (SEAL-L), DoRA (SEAL-D) on 50 records of 80 lines,
# accuracy at 20-100 lines; MuDAF vs Vanilla SFT retrieval scores of the MuDAF target heads.
#
#   bash scripts/tuning_before_after.sh organism runs/tuning    # ~8 min on one CPU thread
set -euo pipefail
M=${1:-organism}
R=${2:-runs/tuning}
mkdir -p "$R"
export OMP_NUM_THREADS=1
T="--num-lines 80 --samples 50 --threads 1 --cpu"
interp-seal tune seal-h --model "$M" $T --out "$R/seal_h"
interp-seal tune seal-c --model "$M" $T --out "$R/seal_c"
interp-seal tune lora --model "$M" $T --out "$R/seal_l"
interp-seal tune dora --model "$M" $T --out "$R/seal_d"
interp-seal tune evaluate --model "$M" --lengths 20 40 60 80 100 --n 50 --threads 1 \
  --scales seal-h="$R/seal_h/scales.safetensors" seal-c="$R/seal_c/scales.safetensors" \
  --tuned seal-l="$R/seal_l/model" seal-d="$R/seal_d/model" --out "$R/accuracy"
interp-seal tune retrieval --model "$M" --task line_retrieval --num-lines 80 --n 50 --seed 0 \
  --threads 1 --out "$R/retrieval_base"
interp-seal tune mudaf --model "$M" --task line_retrieval $T --lr 1e-4 --sample-k 4 \
  --scores "$R/retrieval_base/retrieval.csv" --out "$R/mudaf"
interp-seal tune sft --model "$M" --task line_retrieval $T --lr 1e-4 --out "$R/sft"
interp-seal tune retrieval --model "$M" --task line_retrieval --num-lines 80 --n 50 --seed 0 \
  --threads 1 --targets "$R/mudaf/heads.json" --tuned mudaf="$R/mudaf/model" sft="$R/sft/model" \
  --out "$R/retrieval"
