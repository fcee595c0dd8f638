#!/usr/bin/env bash
# Before/after of every tuner on one model (default: the bundled organism), the numbers behind
# figures/organism/: SEAL-H, SEAL-C, LoRA (SEAL-L), DoRA (SEAL-D) on 50 samples of 160 lines,
# accuracy at 40-200 lines; MuDAF vs Vanilla SFT on 50 synthetic passage-QA samples (10
# passages, LongBench format), the retrieval scores of the MuDAF target heads before / after.
# Training data is seed 1000 (--data-seed), evaluation seed 0.
#
#   bash scripts/tuning_before_after.sh organism runs/tuning
set -euo pipefail
M=${1:-organism}
R=${2:-runs/tuning}
mkdir -p "$R"
export OMP_NUM_THREADS=1
T="--samples 50 --threads 1 --cpu"
L="--num-lines 160"
P="--task passages --num-passages 10"
interp-seal tune seal-h --model "$M" $L $T --out "$R/seal_h"
interp-seal tune seal-c --model "$M" $L $T --out "$R/seal_c"
interp-seal tune lora --model "$M" $L $T --out "$R/seal_l"
interp-seal tune dora --model "$M" $L $T --out "$R/seal_d"
interp-seal tune evaluate --model "$M" --lengths 40 80 120 160 200 --n 50 --threads 1 \
  --scales seal-h="$R/seal_h/scales.safetensors" seal-c="$R/seal_c/scales.safetensors" \
  --tuned seal-l="$R/seal_l/model" seal-d="$R/seal_d/model" --out "$R/accuracy"
interp-seal tune retrieval --model "$M" $P --n 50 --seed 0 --threads 1 --out "$R/retrieval_base"
interp-seal tune mudaf --model "$M" $P $T --lr 1e-4 --sample-k 4 \
  --scores "$R/retrieval_base/retrieval.csv" --out "$R/mudaf"
interp-seal tune sft --model "$M" $P $T --lr 1e-4 --out "$R/sft"
interp-seal tune retrieval --model "$M" $P --n 50 --seed 0 --threads 1 \
  --targets "$R/mudaf/heads.json" --tuned mudaf="$R/mudaf/model" sft="$R/sft/model" \
  --out "$R/retrieval"
