# Issue 46's GPU checks, one call of the device tool (about 8 minutes; not run yet: no GPU was lent when it was
# written). Before the call, in the repository root: copy ../shared/data/multi30k/*.gz to .gpu/multi30k/ and the
# sacremoses wheel to .whl/ (both folders in .git/info/exclude), then
#   run(command="bash benchmarks/gpu_training.sh 2>&1", carry=[".gpu", ".whl"], timeout_s=600)
# 1. quality at equal updates: multi30k_tiny fp32 twice (GPU fp32 is not bitwise repeatable: the noise floor),
#    bf16 and fp32 under train.compile, 3000 updates each, the same seed and batches, validated every 1000;
# 2. training throughput on the GPU (base): the textbook nn.Transformer and tformer, fp32 and bf16 autocast,
#    eager and compiled, taking turns.
set -x
export PYTHONUNBUFFERED=1 TFORMER_SHARED_DATA=$PWD/.gpu
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; which gcc g++
# 1. quality at equal updates (multi30k_tiny, seed 1, the same batches): fp32 twice (GPU fp32 is not bitwise
#    repeatable: the noise floor), bf16, fp32 compiled; four processes share the GPU
for r in fp32: fp32b: bf16:train.precision=bf16 compiled:train.compile=true; do n=${r%%:*}; x=${r#*:}
  timeout 320 python3 -m tformer train --config multi30k_tiny --run-dir runs/conv_$n data.dir=.gpu/multi30k train.device=cuda train.max_steps=3000 train.eval_every=1000 train.max_hours=0 $x --no-progress > $OUT/conv_$n.log 2>&1 &
done
wait
for n in fp32 fp32b bf16 compiled; do echo "== $n"; grep -E "valid|compile|precision|wall|Error" $OUT/conv_$n.log | cut -c1-220 | tail -8; cp runs/conv_$n/metrics.jsonl $OUT/metrics_$n.jsonl; done
# 2. training throughput on the GPU, base, models taking turns
timeout 230 python3 benchmarks/train_throughput.py --device cuda --size base --rounds 5 --steps 10 --variants reference reference-bf16 tformer tformer-bf16 tformer-compiled tformer-compiled-bf16 > $OUT/tp.log 2>&1; echo "tp rc $?"
grep -v Warning $OUT/tp.log | grep -v "key_padding_mask = " | tail -16
