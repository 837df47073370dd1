#!/usr/bin/env bash
# gpu-moe.sh OUT [SECTION...] — the CUDA engine's checks and benches on the GPU machine, run
# from the repository root after `make device-bundle` (binaries in build/device). Logs go to
# OUT/logs/*.txt, the bench's timings to OUT/bench.db. Sections (default: all):
#   tests     tests/gpu/test_cuda_moe (every cuda-vs-ref pair, exact pairs, M sweep, admission)
#   bench     bench/gpu/moe_decode at the production shape (fp16/bf16, prepared/raw,
#             direct/grouped, TP1 and the TP4 slice), with the cuBLAS BF16 baseline; then the
#             store's runs (each names its GPU)
#   audit     tandem audit layer on flash-next-moe-layer (3 layers) and on edge; then the
#             store's runs (each names its GPU)
#   sanitize  compute-sanitizer memcheck and racecheck on small bench runs (the decode kernel,
#             the grouping and routing kernels, the tail by chunks; about 9 minutes)
#   sanitize_parts  the same for the router and shared-expert GEMMs on k_wgp (about 3 minutes;
#             apart, so that each section fits a 10-minute call)
#   profile   the expert kernels' machine code (instruction counts), an ncu profile of one
#             decode step (M = 1) with the decode kernel and with kernels=generic, the
#             grouping and decode kernels of one prefill call (M = 784, grouped) timed alone,
#             and per-instruction execution counts and stall samples of the W13 decode kernel
#             at M = 4 (sass_M4.csv.gz)
#   kernels   every kernel of one block call timed alone under ncu (M = 1, 4, 16), and the
#             decode kernels' machine code with spill (STL/LDL) counts per kernel
#   chain     the block's launches outside the routed experts (round, router and shared expert
#             on k_mm, routing, combine) under ncu at M = 1 and 16, fp16 direct: throughput,
#             launch, occupancy, memory and warp-state sections, and per-instruction stall
#             samples of those kernels at M = 16 (sass_chain_M16.csv.gz) and of the routing
#             kernel at M = 1, one sample per 32 cycles (sass_route_M1.csv.gz)
#   probe     bench/gpu/mem_probe: the memory side's floor for the decode kernel's access
#             pattern (bulk-copy rings and plain loads, no arithmetic), the block's reads in one
#             launch with grid-wide barriers between phases (chains; some with a stand-in for
#             the arithmetic), and where the hardware
#             places the blocks of persistent grids; bench/gpu/mma_probe: wgmma against
#             mma.sync bit for bit, and the latency of wgmma steps
#   prefill   the M = 784 grouped call under ncu: the decode kernels' per-instruction execution
#             counts and stall samples (sass_dec_M784.csv.gz), and the k_wgp GEMMs' (router,
#             shared W13 and W2) throughput, memory, scheduler and warp-state sections with
#             their own per-instruction counts (sass_wgp_M784.csv.gz)
#   wgp784    the router's and shared expert's GEMMs and their input launches under ncu at
#             M = 784 (fp16, bf16), this binary and moe_decode_base
#   ab_combine  the routed W2 with the combine fused in where the engine takes it against the
#             combine as its own launch everywhere, the same binary (moe_decode
#             --separate-combine), three runs each: fp16 and bf16 direct and the TP4 slice,
#             M = 1, 2, 4, 8, 16 (routed and block times)
#   sanitize_w2c  memcheck and racecheck of the fused W2 (direct dispatch: chunks of 10 and 5
#             steps, one and two chunks per row tile, FP16 and BF16, top-10), racecheck of the
#             decode kernel with raw storage and of grouped calls on W13 rows of one chunk
#   narrow    the routed experts' narrow decode-kernel blocks (4 warps, 7 per SM, where
#             td_dec_narrow_pays takes them; moe_decode --no-dec-narrow turns them off): first
#             --check-narrow (the block with them off and on, bit for bit, poisoned outputs) for
#             fp16 and bf16, prepared and raw, TP1 and the TP4 slice; then the A/B in one binary,
#             three runs each, fp16 and bf16 direct and the TP4 slice, M = 1, 2, 4, 8, 16 (routed
#             and block times)
#   stage     the input staged once by the round for the router's and the shared W13's k_mm
#             blocks at decode sizes (moe_decode --no-stage-img turns it off): first --check-stage
#             (the block with it off and on, bit for bit, poisoned outputs, the router's logits
#             and the shared expert's output included) for fp16 and bf16, direct and grouped, the
#             TP4 slice; then the A/B in one binary, three runs each, fp16 and bf16 direct and the
#             TP4 slice, M = 1, 2, 4, 8, 16
#   sanitize_stage  memcheck and racecheck of the router's and the shared W13's k_mm blocks
#             copying the staged input (hidden 320 and 2560, 1 to 200 tokens, FP16 and BF16)
#   sanitize_narrow  memcheck and racecheck of the narrow blocks (W13 and W2 of direct
#             dispatch at sizes where the rule takes them)
#   sanitize_bf16  memcheck and racecheck of the kernels that stage BF16 inputs for NVFP4
#             weights with a power of two per row (the decode kernel direct and grouped, its
#             tail by chunks, the narrow blocks, the fused W2, k_mm with kernels=generic; the
#             direct racecheck takes about 7 minutes: run the section alone)
#   ab_bf16   where the bf16 block's time at M = 1..4 goes, this binary against
#             build/device/moe_decode_base: bf16 direct M = 1, 2, 4, the two alternating, three
#             runs each (block, routed and the chained parts), the same with a shared expert of 32
#             (--shared 32), then every kernel of one call timed alone under ncu at M = 1 and 4
#             for both (kernel, grid, block, µs)
#   timeline  the block's timeline per launch (bench/gpu/moe_decode --timeline) from the
#             diagnostic build carried as build/device/moe_decode_tl (make gpu TIMELINE=1, then
#             copy build/gpu-tl/bench/moe_decode there): fp16 and bf16 direct M = 1, 4, 8, 16,
#             fp16 and bf16 grouped M = 4 and 784
#   ab        A/B of the bench against a baseline binary build/device/moe_decode_base (built
#             from another commit, e.g. a git worktree, and carried beside the bundle) and a
#             third, build/device/moe_decode_alt, where it is there: fp16 direct and grouped,
#             M = 1..16 and 784 grouped, bf16 grouped M = 1, 16, 784, bf16 direct M = 1..16 and
#             the fp16 TP4 slice M = 1..16, the binaries alternating, three runs each (routed and
#             block times per call, no cuBLAS)
#   contend   test_cuda_moe twice side by side while two other processes keep the GPU busy with
#             the bench (M = 16 and 784), then alone: the engine's results must not depend on
#             what else runs (a load that left its uploads and its workspace poison on the
#             legacy default stream unfinished failed 10 to 15 of 23 tests this way)
# The compute-sanitizer lines of the sanitize* sections print their sanitizer's summary line and
# the run's maximum resident set (/usr/bin/time, where it is there) beside rc and seconds.
# Environment:
#   LANES=N       (default 1: each sanitizer line runs where it stands, one at a time) queue the
#                 sanitizer lines of every chosen section and run them N side by side after all
#                 other sections, each lane taking the next line as it finishes one.
#   SAN_MEM_GB=G  (default 50) the host memory one sanitizer line may take at its peak: a
#                 racecheck run held up to 49.3 GB (docs/gpu-results.md, 2026-12-07). A line
#                 starts beside others only while MemAvailable, less what the running lines may
#                 still take (G less each one's resident memory now), is at least G; so lines
#                 that stay within G never take together more than the host had. A line with none
#                 running beside it starts at once.
#   SAN_LIMIT=S   (default 0: none) stop each sanitizer run after S seconds (timeout: rc 124),
#                 so that the lines of a call limited in time end with a log each.
#   SAN_ONLY=A,B  (default: every line) run only the sanitizer lines of these names (the names
#                 the lines print) within the chosen sections, e.g. to run again the lines a call
#                 cut; a name that no chosen section has is an error (exit 2, after the rest ran).
#   PACK=1        (default 0) at the end, or when the script is stopped by TERM or INT (a
#                 timeout), move OUT/logs into the one archive OUT/logs.tgz, for machines that
#                 copy back only a few files; an archive already there is merged in first, so
#                 that calls with the same OUT add to it.
set -u
out=$1; shift
secs=${*:-tests bench audit sanitize sanitize_parts}
B=$PWD/build/device
mkdir -p "$out/logs"
export TD_TEST_TMP=/tmp/tdt; mkdir -p $TD_TEST_TMP
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/logs/gpu.txt" 2>&1
cublas=$(ls /usr/local/cuda/lib64/libcublas.so.* 2>/dev/null | head -1)
[ -z "$cublas" ] && cublas=$(python3 -c 'import nvidia.cublas, os; d=os.path.join(list(nvidia.cublas.__path__)[0], "lib"); print(os.path.join(d, sorted(f for f in os.listdir(d) if f.startswith("libcublas.so"))[0]))' 2>/dev/null)
[ -z "$cublas" ] && cublas=$(find / -name 'libcublas.so.*' -not -path '*/proc/*' 2>/dev/null | head -1)
echo "cublas: $cublas" >> "$out/logs/gpu.txt"
t() { local name=$1; shift; local t0=$(date +%s); "$@" > "$out/logs/$name.txt" 2>&1; local rc=$?;
      printf "%-28s rc=%d %ss\n" "$name" $rc $(( $(date +%s) - t0 )); }
# s NAME CMD...: a compute-sanitizer run; at once with LANES=1, else queued for run_queue
# die MESSAGE: a bad setting or bundle, before or after the sections: stderr, exit 2
die() { echo "gpu-moe.sh: $*" >&2; exit 2; }
LANES=${LANES:-1}; SAN_MEM_GB=${SAN_MEM_GB:-50}; SAN_LIMIT=${SAN_LIMIT:-0}; PACK=${PACK:-0}
case "$LANES$SAN_MEM_GB$SAN_LIMIT" in *[!0-9]*) die "LANES, SAN_MEM_GB and SAN_LIMIT take whole numbers";; esac
case "$PACK" in 0|1) ;; *) die "PACK takes 0 or 1";; esac
SAN_ONLY=${SAN_ONLY:-}
case "$SAN_ONLY" in *[!a-z0-9_,]*) die "SAN_ONLY takes line names (a-z, 0-9, _) separated by commas";; esac
san_seen=,
# pack: OUT/logs into OUT/logs.tgz (with PACK=1), an earlier archive's logs merged in first
pack() { [ "$PACK" = 1 ] && [ -d "$out/logs" ] || return 0
  [ -f "$out/logs.tgz" ] && tar xzf "$out/logs.tgz" -C "$out" --skip-old-files
  tar czf "$out/logs.tgz.part" -C "$out" logs && mv "$out/logs.tgz.part" "$out/logs.tgz" && rm -rf "$out/logs"; }
trap 'pack; exit 143' TERM
trap 'pack; exit 130' INT
# a bundle made with COMPACT=1 (scripts/device-bundle.sh) carries its binaries as NAME.xz
for z in "$B"/*.xz; do
  [ -e "$z" ] || continue
  xz -d -f "$z" || die "cannot decompress $z"
done
# where MemAvailable is read (the host's; the script's tests name a file of their own)
MEMINFO=${TD_MEMINFO:-/proc/meminfo}
queue=()
st() { local name=$1; shift; local t0=$(date +%s) pre=()
  [ "$SAN_LIMIT" -gt 0 ] && pre=(timeout "$SAN_LIMIT")
  [ -x /usr/bin/time ] && pre+=(/usr/bin/time -v)
  "${pre[@]}" "$@" > "$out/logs/$name.txt" 2>&1; local rc=$?
  local rss=$(awk '/Maximum resident set size/ {printf "rss %.1f GB", $NF / 1048576}' "$out/logs/$name.txt")
  local sum=$(grep -E '(ERROR|RACECHECK) SUMMARY' "$out/logs/$name.txt" | tail -1 | sed 's/^=* *//')
  [ $rc -eq 124 ] && [ "$SAN_LIMIT" -gt 0 ] && sum="cut at SAN_LIMIT=${SAN_LIMIT}s, no summary"
  printf "%-28s rc=%d %ss %s %s\n" "$name" $rc $(( $(date +%s) - t0 )) "$rss" "$sum"; }
s() { if [ -n "$SAN_ONLY" ]; then case ",$SAN_ONLY," in *",$1,"*) san_seen="$san_seen$1,";; *) return 0;; esac; fi
      if [ "$LANES" -le 1 ]; then st "$@"; else queue+=("$(printf '%q ' "$@")"); fi; }
# room RUN: whether a line may start beside those marked in RUN (a file per running line holding
# its subshell's pid, empty until the subshell has written it): MemAvailable less what each may
# still take (SAN_MEM_GB less its process tree's resident memory now; all of SAN_MEM_GB while its
# pid is not there) is at least SAN_MEM_GB. No MemAvailable read: no room.
room() { local run=$1 f v ids=
  for f in "$run"/*; do [ -e "$f" ] || continue; v=$(cat "$f" 2> /dev/null); ids="$ids ${v:-x}"; done
  ps -e -o pid=,ppid=,rss= | awk -v ids="$ids" -v mi="$MEMINFO" -v g="$SAN_MEM_GB" '
    { par[$1] = $2; rss[$1] = $3 }
    END {
      avail = -1
      while ((getline l < mi) > 0) if (split(l, w, " ") >= 2 && w[1] == "MemAvailable:") avail = w[2]
      if (avail < 0) exit 1
      peak = g * 1048576; left = avail
      n = split(ids, id, " ")
      for (i = 1; i <= n; i++) {
        used = 0
        if (id[i] != "x") for (q in par) { r = q; d = 0
            while (r != id[i] && (r in par) && d++ < 64) r = par[r]
            if (r == id[i]) used += rss[q] }
        if (used < peak) left -= peak - used }
      exit !(left >= peak) }'; }
# run_queue: the queued sanitizer lines in LANES lanes, in queue order, each line once
run_queue() {
  [ ${#queue[@]} -eq 0 ] && return 0
  local next="$out/.queue_next" lock="$out/.queue_lock" run="$out/.queue_running" l
  echo 0 > "$next"; mkdir -p "$run"
  lane() { local i p
    while :; do
      exec 9> "$lock"; flock 9
      i=$(cat "$next"); echo $(( i + 1 )) > "$next"
      if [ "$i" -ge ${#queue[@]} ]; then flock -u 9; return 0; fi
      # wait for room only while another line runs: alone, a line starts whatever is free
      while [ -n "$(ls -A "$run")" ] && ! room "$run"; do sleep 1; done
      # the mark first (counted at the whole SAN_MEM_GB until the subshell writes its pid)
      : > "$run/$i"; ( echo $BASHPID > "$run/$i"; eval "st ${queue[$i]}"; rm -f "$run/$i" ) & p=$!
      flock -u 9; wait $p
    done; }
  echo "sanitizer lines: ${#queue[@]} in $LANES lanes (one starts beside others while the host keeps ${SAN_MEM_GB} GB for it beyond what the running ones may take)"
  for l in $(seq "$LANES"); do lane & done
  wait
  rm -rf "$next" "$lock" "$run"; queue=(); }
# abf PREFIX ON OFF FLAG: moe_decode with FLAG (logs PREFIX_ON_*) and without (PREFIX_OFF_*), the
# two alternating, three runs each: fp16 and bf16 direct and the fp16 TP4 slice, M = 1..16
abf() { local p=$1 on=$2 off=$3 flag=$4;
  for run in 1 2 3; do
    for v in $on $off; do
      local f=; [ $v = $on ] && f=$flag
      t ${p}_${v}_fp16_$run $B/moe_decode --no-cublas --act fp16 --M 1,2,4,8,16 $f
      t ${p}_${v}_bf16_$run $B/moe_decode --no-cublas --act bf16 --M 1,2,4,8,16 $f
      t ${p}_${v}_tp4_$run $B/moe_decode --no-cublas --act fp16 --tp 4 --M 1,2,4,8,16 $f
    done
  done; }
for s in $secs; do case $s in
tests)
  t test_cuda_moe $B/test_cuda_moe ;;
bench)
  for cfg in "--act fp16" "--act fp16 --kernels generic" "--act fp16 --dispatch grouped" "--act fp16 --storage raw" "--act bf16" \
             "--act bf16 --dispatch grouped" "--act fp16 --tp 4" "--act fp16 --tp 4 --dispatch grouped"; do
    n=bench_$(echo $cfg | tr -d '-' | tr ' ' '_')
    t $n $B/moe_decode $cfg --cublas "$cublas" --db "$out/bench.db"
  done
  t bench_runs $B/tandem db runs --db "$out/bench.db" ;;
audit)
  t gen_fml $B/tandem gen --preset flash-next-moe-layer --layers 0,23,47 --out /tmp/fml3 --seed 1
  t gen_edge $B/tandem gen --preset edge --out /tmp/edge --seed 1
  t audit_fml $B/tandem audit layer --model /tmp/fml3 --layers 0,23,47 --ranks 0,3 --tokens 1,4,8,16,784 \
    --pair ref,cuda --pair ref,cuda:act_dtype=fp16 \
    --pair 'ref:scale=fp16,act_dtype=fp16,cuda:act_dtype=fp16' \
    --pair 'ref:scale=fp16,act_dtype=bf16,cuda:act_dtype=bf16' \
    --pair 'cuda:act_dtype=fp16,cuda:act_dtype=fp16,storage=raw' \
    --pair 'cuda:act_dtype=fp16,cuda:act_dtype=fp16,graphs=on' \
    --pair 'cuda:act_dtype=fp16,cuda:act_dtype=fp16,moe_dispatch=grouped@exact' \
    --pair 'cuda:act_dtype=fp16,cuda:act_dtype=fp16,kernels=generic' \
    --pair 'cuda:act_dtype=bf16,storage=raw,cuda:act_dtype=bf16,storage=raw,kernels=generic' \
    --pair 'cuda:act_dtype=bf16,storage=raw,cuda:act_dtype=bf16,moe_dispatch=grouped,graphs=on@exact' \
    --db "$out/audit.db" --out "$out/audit_fml_rows.json" --no-progress
  t audit_edge_prepared $B/tandem audit layer --model /tmp/edge --pair 'ref:scale=fp16,act_dtype=fp16,cuda:act_dtype=fp16' \
    --pair 'cuda:act_dtype=fp16,cuda:act_dtype=fp16,moe_dispatch=grouped,graphs=on@exact' --db "$out/audit.db" --no-progress
  t audit_edge_raw $B/tandem audit layer --model /tmp/edge --pair 'cuda:act_dtype=fp16,cuda:act_dtype=fp16,storage=raw' --db "$out/audit.db" --no-progress
  t audit_runs $B/tandem db runs --db "$out/audit.db" ;;
sanitize)
  s memcheck compute-sanitizer --tool memcheck --error-exitcode 9 $B/moe_decode --experts 64 --M 1,3,4,5,16,40 --iters 3 --sets 2 --act fp16 --dispatch grouped
  s memcheck_raw compute-sanitizer --tool memcheck --error-exitcode 9 $B/moe_decode --experts 64 --M 3,17 --iters 3 --sets 2 --act bf16 --storage raw --tp 4
  # hidden 320 / inter 160: chunks of 10 and 5 steps, so W13 and W2 run on the decode kernel
  # (one, two and three 8-token tiles at M = 1, 9 and 300; packs of 4 at M = 4), the grouping
  # kernels on 10 to 90 slots (k_group_small), 160 (k_group<1>) and 3,000 (k_group<8>), and the
  # routing of one warp per token at 300 tokens
  s racecheck compute-sanitizer --tool racecheck --error-exitcode 9 $B/moe_decode --no-cublas --experts 32 --hidden 320 --inter 160 --shared 160 --M 1,4,9,16,300 --iters 2 --sets 1 --act fp16 --dispatch grouped
  # the same with BF16 inputs
  s racecheck_bf16 compute-sanitizer --tool racecheck --error-exitcode 9 $B/moe_decode --no-cublas --experts 32 --hidden 320 --inter 160 --shared 160 --M 1,9,300 --iters 2 --sets 1 --act bf16 --dispatch grouped
  # the decode kernel's last items by chunks: 128 experts, top-8, hidden 640 / inter 320 (W13
  # with two chunks per row tile): direct dispatch at M = 10 and 17 (400 and 680 W13 items on a
  # 132-SM GPU's 396 blocks) with FP16 inputs, grouped at M = 20 (about 90 groups) with BF16
  s racecheck_tail compute-sanitizer --tool racecheck --error-exitcode 9 $B/moe_decode --no-cublas --experts 128 --topk 8 --hidden 640 --inter 320 --shared 160 --M 10,17 --iters 2 --sets 1 --act fp16
  s racecheck_tail_grouped compute-sanitizer --tool racecheck --error-exitcode 9 $B/moe_decode --no-cublas --experts 128 --topk 8 --hidden 640 --inter 320 --shared 160 --M 20 --iters 2 --sets 1 --act bf16 --dispatch grouped ;;
sanitize_parts)
  # 300 tokens, hidden 512, shared expert 2048: router, shared W13 and W2 run on k_wgp (wgmma;
  # issuer and consumer warps on mbarriers, the ring wrapping several times; the shared W13's
  # 160 blocks of 128 rows with two consumer warpgroups, the router and W2 with one; the input
  # laid out by the round, the shared W2's by k_wsplit), FP16 and BF16 inputs; the same under
  # memcheck
  for a in fp16 bf16; do
    s racecheck_parts_$a compute-sanitizer --tool racecheck --error-exitcode 9 $B/moe_decode --no-cublas --experts 16 --hidden 512 --inter 64 --shared 2048 --topk 4 --M 300 --iters 1 --sets 1 --act $a
    s memcheck_parts_$a compute-sanitizer --tool memcheck --error-exitcode 9 $B/moe_decode --no-cublas --experts 16 --hidden 512 --inter 64 --shared 2048 --topk 4 --M 300 --iters 1 --sets 1 --act $a
  done ;;
kernels)
  for m in 1 4 16; do
    t ncu_block_M$m ncu --clock-control none --metrics gpu__time_duration.sum,sm__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed \
      $B/moe_decode --no-cublas --M $m --iters 1 --sets 1 --act fp16
  done
  for bin in moe_decode moe_decode_base; do
    [ -x $B/$bin ] || continue
    cuobjdump -sass $B/$bin | awk '/Function : /{name=$3; p = (name ~ /k_dec/)} p && /STL|LDL/{spill[name]++} p && /^ +\/\*[0-9a-f]+\*\//{n[name]++}
      END {for (k in n) printf "%-60s %6d instructions %4d STL/LDL\n", k, n[k], spill[k]}' | sort > "$out/logs/sass_dec_$bin.txt"
  done ;;
chain)
  for m in 1 16; do
    t ncu_chain_M$m ncu --clock-control none --kernel-name regex:'k_mm|k_route|k_round|k_combine|k_w2c' --launch-count 8 \
      --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
      $B/moe_decode --no-cublas --M $m --iters 1 --sets 1 --act fp16
  done
  ncu --clock-control none --kernel-name regex:'k_mm|k_route' --launch-count 4 --section SourceCounters --page source \
    --print-source sass --csv $B/moe_decode --no-cublas --M 16 --iters 1 --sets 1 --act fp16 2>&1 \
    | gzip > "$out/logs/sass_chain_M16.csv.gz"
  # the routing kernel of one token, sampled every 32 cycles
  ncu --clock-control none --kernel-name regex:'k_route' --launch-count 1 --section SourceCounters --warp-sampling-interval 0 \
    --page source --print-source sass --csv $B/moe_decode --no-cublas --M 1 --iters 1 --sets 1 --act fp16 2>&1 \
    | gzip > "$out/logs/sass_route_M1.csv.gz" ;;
probe)
  t mem_probe $B/mem_probe
  t mma_probe $B/mma_probe ;;
prefill)
  ncu --clock-control none --kernel-name regex:'k_dec' --launch-count 2 --section SourceCounters --page source \
    --print-source sass --csv $B/moe_decode --no-cublas --M 784 --iters 1 --sets 1 --act fp16 --dispatch grouped 2>&1 \
    | gzip > "$out/logs/sass_dec_M784.csv.gz"
  t ncu_wgp ncu --clock-control none --kernel-name regex:'k_wgp' --launch-count 3 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section Occupancy \
    --section SchedulerStats --section WarpStateStats \
    --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum.per_second \
    $B/moe_decode --no-cublas --M 784 --iters 1 --sets 1 --act fp16 --dispatch grouped
  ncu --clock-control none --kernel-name regex:'k_wgp' --launch-count 3 --section SourceCounters --page source \
    --print-source sass --csv $B/moe_decode --no-cublas --M 784 --iters 1 --sets 1 --act fp16 --dispatch grouped 2>&1 \
    | gzip > "$out/logs/sass_wgp_M784.csv.gz" ;;
ab_combine)
  abf abc separate fused --separate-combine ;;
sanitize_w2c)
  # a racecheck of the lines below holds 29-49 GB of host memory (docs/gpu-results.md): seven
  # sanitizer runs side by side on a 125 GB machine ended two of them, so side by side only in
  # lanes (LANES, SAN_MEM_GB above).
  # direct dispatch, top-10, where W2 takes the combine fused in (td_w2c_pays): at the production
  # shape M = 1 (TP1) and M = 1, 4, 8 (the TP4 slice: chunks of 5 steps); hidden 320 with
  # inter 640 (two chunks of 10 steps per row tile) at M = 1 and 5, inter 320 (one chunk) at
  # M = 1 and 9, the TP4 slice of inter 640 (one chunk of 5) at M = 2 and 16
  s memcheck_w2c compute-sanitizer --tool memcheck --error-exitcode 9 $B/moe_decode --no-cublas --experts 64 --M 1,3,16 --iters 3 --sets 2 --act fp16
  s memcheck_w2c_tp4 compute-sanitizer --tool memcheck --error-exitcode 9 $B/moe_decode --no-cublas --experts 64 --M 1,4,8,17 --iters 3 --sets 2 --act bf16 --tp 4
  s racecheck_w2c compute-sanitizer --tool racecheck --error-exitcode 9 $B/moe_decode --no-cublas --experts 32 --hidden 320 --inter 640 --shared 160 --M 1,5 --iters 2 --sets 1 --act fp16
  s racecheck_w2c_bf16 compute-sanitizer --tool racecheck --error-exitcode 9 $B/moe_decode --no-cublas --experts 32 --hidden 320 --inter 320 --shared 160 --M 1,9 --iters 2 --sets 1 --act bf16
  s racecheck_w2c_tp4 compute-sanitizer --tool racecheck --error-exitcode 9 $B/moe_decode --no-cublas --experts 32 --hidden 320 --inter 640 --shared 640 --tp 4 --M 2,16 --iters 2 --sets 1 --act fp16
  # grouped dispatch on W13 rows of one chunk (20 row tiles on 8-warp items): where racecheck
  # reported the ring's reads before its wait was joined (cu_mbar_wait_warp)
  s racecheck_grouped_nc1 compute-sanitizer --tool racecheck --error-exitcode 9 $B/moe_decode --no-cublas --experts 32 --hidden 320 --inter 160 --shared 160 --M 16,25 --iters 2 --sets 1 --act fp16 --dispatch grouped
  # top-12 at 40 tokens: 800 items on 264 blocks, 3 or 4 per block (the slots' output buffers
  # by item parity reused, tokens changing inside a block), with the shared expert's term
  s racecheck_w2c_items compute-sanitizer --tool racecheck --error-exitcode 9 $B/moe_decode --no-cublas --experts 32 --hidden 320 --inter 320 --shared 160 --topk 12 --M 40 --iters 2 --sets 1 --act fp16
  # raw storage on the decode kernel (the separate combine), the shape of racecheck_w2c_bf16
  s racecheck_raw_dec compute-sanitizer --tool racecheck --error-exitcode 9 $B/moe_decode --no-cublas --experts 32 --hidden 320 --inter 320 --shared 160 --M 1,9 --iters 2 --sets 1 --act bf16 --storage raw ;;
narrow)
  for cfg in "--act fp16" "--act bf16" "--act fp16 --storage raw" "--act fp16 --tp 4" "--act bf16 --tp 4 --storage raw"; do
    n=check_narrow_$(echo $cfg | tr -d '-' | tr ' ' '_')
    t $n $B/moe_decode --no-cublas --check-narrow --iters 3 --sets 2 --M 1,2,3,4,5,8,9,16,17,32 $cfg
  done
  abf abn wide narrow --no-dec-narrow ;;
stage)
  for cfg in "--act fp16" "--act bf16" "--act fp16 --dispatch grouped" "--act bf16 --storage raw --tp 4"; do
    n=check_stage_$(echo $cfg | tr -d '-' | tr ' ' '_')
    t $n $B/moe_decode --no-cublas --check-stage --iters 3 --sets 2 --M 1,2,3,4,5,8,9,16,17,32,200 $cfg
  done
  abf abs self staged --no-stage-img ;;
sanitize_stage)
  s memcheck_stage compute-sanitizer --tool memcheck --error-exitcode 9 $B/moe_decode --no-cublas --experts 64 --M 1,9,16,200 --iters 2 --sets 1 --act fp16
  s memcheck_stage_bf16 compute-sanitizer --tool memcheck --error-exitcode 9 $B/moe_decode --no-cublas --experts 64 --M 1,16 --iters 2 --sets 1 --act bf16 --dispatch grouped
  s racecheck_stage compute-sanitizer --tool racecheck --error-exitcode 9 $B/moe_decode --no-cublas --experts 32 --hidden 320 --inter 160 --shared 160 --M 1,9,17,200 --iters 2 --sets 1 --act fp16
  s racecheck_stage_bf16 compute-sanitizer --tool racecheck --error-exitcode 9 $B/moe_decode --no-cublas --experts 32 --hidden 320 --inter 160 --shared 160 --M 1,16 --iters 2 --sets 1 --act bf16 ;;
sanitize_narrow)
  # the TP4 slice, where the rule takes them: W2 (160 row tiles of one chunk) at M = 2 and 16,
  # W13 (20 row tiles of 8 chunks) at M = 16; racecheck at hidden 640 / inter 160 (W13 20 row
  # tiles of 2 chunks, W2 40 of 1, the combine apart so that W2 is k_dec's): M = 16 (W13 800
  # items on 800 blocks, W2 1,600 on 924: one or two per block, blocks crossing groups, a new
  # staged row) and M = 32 (W13 1,600 on 924)
  s memcheck_narrow compute-sanitizer --tool memcheck --error-exitcode 9 $B/moe_decode --no-cublas --tp 4 --M 2,16 --iters 2 --sets 1 --act fp16
  s memcheck_narrow_raw compute-sanitizer --tool memcheck --error-exitcode 9 $B/moe_decode --no-cublas --tp 4 --M 4,16 --iters 2 --sets 1 --act bf16 --storage raw
  s racecheck_narrow compute-sanitizer --tool racecheck --error-exitcode 9 $B/moe_decode --no-cublas --experts 128 --hidden 640 --inter 160 --shared 160 --M 16,32 --iters 2 --sets 1 --act fp16 --separate-combine ;;
sanitize_bf16)
  s memcheck_bf16 compute-sanitizer --tool memcheck --error-exitcode 9 $B/moe_decode --no-cublas --experts 64 --M 1,4,5,16,40 --iters 2 --sets 1 --act bf16
  # grouped prefill with BF16 inputs (stage_x SC 2: the rows' epilogue factors staged once):
  # 300 tokens on the small shape (W13 and W2 in chunks of 10 and 5 steps) and 784 on 64
  # experts of the production rows
  s memcheck_bf16_grouped compute-sanitizer --tool memcheck --error-exitcode 9 $B/moe_decode --no-cublas --experts 32 --hidden 320 --inter 160 --shared 160 --M 300 --iters 2 --sets 1 --act bf16 --dispatch grouped
  s memcheck_bf16_prefill compute-sanitizer --tool memcheck --error-exitcode 9 $B/moe_decode --no-cublas --experts 64 --M 784 --iters 1 --sets 1 --act bf16 --dispatch grouped
  s memcheck_bf16_generic compute-sanitizer --tool memcheck --error-exitcode 9 $B/moe_decode --no-cublas --experts 64 --M 1,17 --iters 2 --sets 1 --act bf16 --kernels generic
  s racecheck_bf16_direct compute-sanitizer --tool racecheck --error-exitcode 9 $B/moe_decode --no-cublas --experts 32 --hidden 320 --inter 160 --shared 160 --M 1,4,9,16,300 --iters 2 --sets 1 --act bf16
  s racecheck_bf16_generic compute-sanitizer --tool racecheck --error-exitcode 9 $B/moe_decode --no-cublas --experts 32 --hidden 320 --inter 160 --shared 160 --M 1,9,17,40 --iters 2 --sets 1 --act bf16 --kernels generic --dispatch grouped
  s racecheck_bf16_tail compute-sanitizer --tool racecheck --error-exitcode 9 $B/moe_decode --no-cublas --experts 128 --topk 8 --hidden 640 --inter 320 --shared 160 --M 10,17 --iters 2 --sets 1 --act bf16
  s racecheck_bf16_w2c compute-sanitizer --tool racecheck --error-exitcode 9 $B/moe_decode --no-cublas --experts 32 --hidden 320 --inter 640 --shared 160 --M 1,5 --iters 2 --sets 1 --act bf16
  s racecheck_bf16_narrow compute-sanitizer --tool racecheck --error-exitcode 9 $B/moe_decode --no-cublas --experts 128 --hidden 640 --inter 160 --shared 160 --M 16,32 --iters 2 --sets 1 --act bf16 --separate-combine ;;
timeline)
  [ -x $B/moe_decode_tl ] || { echo "timeline: no $B/moe_decode_tl"; exit 2; }
  for a in fp16 bf16; do
    t timeline_${a}_direct $B/moe_decode_tl --no-cublas --act $a --M 1,4,8,16 --iters 50 --timeline 3
    t timeline_${a}_grouped $B/moe_decode_tl --no-cublas --act $a --dispatch grouped --M 4,784 --iters 20 --timeline 2
  done ;;
ab_bf16)
  [ -x $B/moe_decode_base ] || { echo "ab_bf16: no $B/moe_decode_base"; exit 2; }
  for run in 1 2 3; do
    for bin in moe_decode moe_decode_base; do
      t abb_${bin}_$run $B/$bin --no-cublas --act bf16 --M 1,2,4
      t abbs_${bin}_$run $B/$bin --no-cublas --act bf16 --M 1,2,4 --shared 32
    done
  done
  for bin in moe_decode moe_decode_base; do
    for m in 1 4; do
      ncu --csv --clock-control none --metrics gpu__time_duration.sum $B/$bin --no-cublas --M $m --iters 1 --sets 1 --act bf16 2>&1 \
        | awk -F'","' '/gpu__time_duration/ && $5 !~ /k_fill/ {gsub(/"/, "", $NF); printf "%-16s %-14s %-10s %s\n", substr($5, 1, 16), $9, $8, $NF}' \
        > "$out/logs/ncub_${bin}_M$m.txt"
    done
  done ;;
contend)
  noise() { local end=$(( $(date +%s) + $1 )); while [ $(date +%s) -lt $end ]; do
      $B/moe_decode --no-cublas --M 16,784 --iters 50 --sets 4 > /dev/null 2>&1; done; }
  noise 170 & noise 170 &
  for i in 1 2; do
    ( mkdir -p $TD_TEST_TMP/contend_$i; TD_TEST_TMP=$TD_TEST_TMP/contend_$i t test_cuda_moe_loaded_$i $B/test_cuda_moe ) &
  done
  wait
  t test_cuda_moe_alone $B/test_cuda_moe ;;
ab)
  [ -x $B/moe_decode_base ] || { echo "ab: no $B/moe_decode_base"; exit 2; }
  bins="moe_decode moe_decode_base"; [ -x $B/moe_decode_alt ] && bins="$bins moe_decode_alt"
  for run in 1 2 3; do
    for bin in $bins; do
      t ab_${bin}_direct_$run $B/$bin --no-cublas --act fp16 --M 1,2,4,8,16
      t ab_${bin}_grouped_$run $B/$bin --no-cublas --act fp16 --dispatch grouped --M 1,4,8,16,784
      t ab_${bin}_bf16_$run $B/$bin --no-cublas --act bf16 --dispatch grouped --M 1,16,784
      t ab_${bin}_bf16d_$run $B/$bin --no-cublas --act bf16 --M 1,2,4,8,16
      t ab_${bin}_tp4_$run $B/$bin --no-cublas --act fp16 --tp 4 --M 1,2,4,8,16
    done
  done ;;
wgp784)
  # the prefill-sized BF16 GEMMs and the launches that prepare their inputs timed alone under
  # ncu (M = 784 grouped, fp16 and bf16), this binary and the baseline's when it is there
  for a in fp16 bf16; do for bin in moe_decode moe_decode_base; do
    [ -x $B/$bin ] || continue
    t ncu784_${bin}_$a ncu --clock-control none --kernel-name regex:'k_round|k_wsplit|k_wgp|k_gemm' --launch-count 10 \
      --metrics gpu__time_duration.sum $B/$bin --no-cublas --M 784 --iters 1 --sets 1 --act $a --dispatch grouped
  done; done ;;
profile)
  # machine code of every instance of the two expert kernels (names are mangled: filter by header)
  cuobjdump -sass $B/moe_decode > "$out/logs/sass_all.txt" 2>&1
  awk '/Function : /{p = ($0 ~ /k_dec|k_mm/)} p' "$out/logs/sass_all.txt" > "$out/logs/sass_experts.txt"
  rm -f "$out/logs/sass_all.txt"
  for kn in fast generic; do
    t ncu_$kn ncu --clock-control none --kernel-name regex:'k_dec|k_mm|k_route' --launch-count 8 \
      --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
      --section LaunchStats --section InstructionStats \
      --metrics sass__inst_executed_per_opcode,smsp__pcsamp_warps_issue_stalled_long_scoreboard,smsp__pcsamp_warps_issue_stalled_barrier \
      $B/moe_decode --no-cublas --M 1 --iters 3 --sets 2 --act fp16 --kernels $kn
  done
  t ncu_prefill ncu --clock-control none --kernel-name regex:'k_group|k_dec' --launch-count 3 \
    --metrics gpu__time_duration.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed \
    $B/moe_decode --no-cublas --M 784 --iters 1 --sets 1 --act fp16 --dispatch grouped
  ncu --clock-control none --kernel-name regex:'k_dec' --launch-count 1 --section SourceCounters --page source \
    --print-source sass --csv $B/moe_decode --no-cublas --M 4 --iters 1 --sets 1 --act fp16 2>&1 | gzip > "$out/logs/sass_M4.csv.gz" ;;
esac; done
run_queue
pack
# SAN_ONLY: every name must have been a line of the chosen sections
missing=
for n in ${SAN_ONLY//,/ }; do case "$san_seen" in *",$n,"*) ;; *) missing="$missing $n";; esac; done
[ -z "$missing" ] || die "SAN_ONLY names no line of the sections run:$missing"
