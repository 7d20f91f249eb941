# one device call (device tool, from the repository root): the canary alone first (ALONE=1, on an H200 only), the
# canary sites' known-bad and correct examples (SITES=problem,...; SITES_S seconds at most), the
# catalogue resumed from devrun/catalogue.json (REDO=1: audit again rows with no verdict; ONLY: definitions), beside it
# SOL-ExecBench's own samples with the canary stage (OFFICIAL=substrings of their paths; the upstream files saved unchanged
# under devrun/official, as benchmarks/official_samples.py lays them out; OFFICIAL_S seconds at most), then the canary
# false-positive repeats (FP=1; FIRST, SEEDS) until END seconds; NOCAT=1 skips the catalogue; TB=1 first runs
# benchmarks/timing_budget_check.py (a 0.3 s-a-call kernel against a 2 s timing budget); GPUTEST=1 then runs the
# GPU-marked tests, a line each (pytest and its dependencies carried as wheels in .whl; GPUTEST_S seconds at most,
# 420 unless set: 240 s ran 36 of the 39 on an H100).
# What comes back: $OUT/run.tgz (every file; the device tool returns at most 8 files) and misc.log
export PYTHONUNBUFFERED=1
BACK=$OUT
OUT=$(mktemp -d)
pack() { tar czf $BACK/run.tgz -C $OUT . 2>/dev/null; cp $OUT/misc.log $BACK/ 2>/dev/null; }
trap pack EXIT
trap 'exit 143' TERM INT
L=$OUT/misc.log
(date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; git log --oneline -1; uptime) > $L 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site-packages .whl/*.whl >> $L 2>&1 || exit 1
export PYTHONPATH=/tmp/site-packages:$PWD
dpkg -x .whl/bubblewrap*.deb /tmp/bw && export PATH=/tmp/bw/usr/bin:$PATH
which bwrap >> $L
(bwrap --version; bwrap --ro-bind / / --dev /dev --proc /proc true; echo "bwrap rc $?"; ldd $(which bwrap)) >> $L 2>&1
python devrun/intake_diag.py >> $L 2>&1 || { echo "intake fails: no catalogue" >> $L; exit 1; }
python -c "import torch,triton;print(torch.__version__,triton.__version__)" >> $L 2>&1
END=${END:-570}
MEM=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
[ -z "$JOBS" ] && { [ "$MEM" -gt 100000 ] && JOBS=4 || JOBS=3; }
echo "jobs $JOBS" >> $L
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || ALONE=
if [ -n "$ALONE" ]; then
  echo "== canary alone $(date -u +%T) SECONDS=$SECONDS" >> $L
  python benchmarks/canary_cost.py --device cuda --audits 3 --as-worker --out $OUT/canary_alone_worker.json > $OUT/canary_alone_worker.txt 2>&1
  python benchmarks/canary_cost.py --device cuda --audits 3 --out $OUT/canary_alone.json > $OUT/canary_alone.txt 2>&1
fi
if [ -n "$TB" ]; then
  echo "== timing budget $(date -u +%T) SECONDS=$SECONDS" >> $L
  timeout 120 python benchmarks/timing_budget_check.py --sleep-s 0.3 --budget-s 2 --out $OUT/timing_budget.json > $OUT/timing_budget.txt 2>&1
fi
if [ -n "$GPUTEST" ]; then
  echo "== gpu tests $(date -u +%T) SECONDS=$SECONDS" >> $L
  timeout ${GPUTEST_S:-420} python -m pytest -m gpu -p no:cacheprovider -v -rs $(grep -rl "mark.gpu" tests/worker) > $OUT/gpu_tests.txt 2>&1
  echo "gpu tests rc $?" >> $L
fi
if [ -n "$SITES" ]; then
  echo "== canary sites $SITES $(date -u +%T) SECONDS=$SECONDS" >> $L
  timeout ${SITES_S:-200} python benchmarks/canary_sites.py --device cuda --only $SITES --jobs ${SITES_JOBS:-4} --out $OUT/canary_sites > $OUT/canary_sites.log 2>&1
fi
echo "== catalogue $(date -u +%T) SECONDS=$SECONDS" >> $L
(while true; do nvidia-smi --query-gpu=memory.used --format=csv,noheader >> $OUT/smi.log; sleep 20; done) &
cp devrun/catalogue.json $OUT/catalogue.json
if [ -n "$OFFICIAL" ]; then
  echo "== official samples $OFFICIAL $(date -u +%T) SECONDS=$SECONDS" >> $L
  timeout ${OFFICIAL_S:-450} python benchmarks/official_samples.py --root devrun/official --device cuda \
    --stages intake,static,benchmark,probes,canary --only $OFFICIAL --out $OUT/official > $OUT/official.log 2>&1 &
  OFFICIAL_PID=$!
fi
[ -z "$NOCAT" ] && python benchmarks/generic_catalogue.py --device cuda --with-curated --canary --fresh-process --breadth-first --jobs ${JOBS:-3} --budget-s $((${CATEND:-$END}-SECONDS)) --resume ${REDO:+--redo-inconclusive} ${ONLY:+--only $ONLY} --out $OUT/catalogue.md > $OUT/catalogue.log 2>&1
[ -n "$OFFICIAL_PID" ] && { wait $OFFICIAL_PID; echo "== official samples done $(date -u +%T) SECONDS=$SECONDS" >> $L; }
if [ -n "$FP" ] && [ $((END-SECONDS)) -gt 60 ]; then
  echo "== fp repeats $(date -u +%T) SECONDS=$SECONDS" >> $L
  python benchmarks/canary_sites.py --device cuda --expected pass --lazy-nulls --fresh-process --first-seed ${FIRST:-1} --seeds ${SEEDS:-20} --jobs ${FPJOBS:-5} --budget-s $((END-SECONDS)) --only linear_backward,swiglu_gate_up,post_add_rmsnorm,attention_forward,rope --out $OUT/fp > $OUT/fp.log 2>&1
fi
echo "== end $(date -u +%T) SECONDS=$SECONDS" >> $L
