#!/usr/bin/env bash
# Every mode of warmpool-bench, briefly: each must run to the end and print one JSON object with
# the fields docs/benchmarks.md quotes. The figures themselves are not checked (no timed
# assertions); this only keeps a mode from breaking unseen.
set -euo pipefail
bench=$1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

run() {
  local name=$1 fields=$2
  shift 2
  if ! "$bench" "$@" --json >"$out/$name.json" 2>"$out/$name.err"; then
    echo "warmpool-bench $* failed:" >&2
    tail -n 30 "$out/$name.err" >&2
    exit 1
  fi
  python3 - "$out/$name.json" "$fields" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
doc = json.loads(text)
missing = [f for f in sys.argv[2].split(",") if f and f not in doc]
if missing:
    sys.exit(f"{sys.argv[1]}: no {missing} in {text[:400]}")
PY
  echo "ok: warmpool-bench $*"
}

run latency relay,warmpool --requests 200 --warmup 20 --rounds 2
run recovery mode --recovery --iterations 2 --model-mib 1 --rows 4
run sharing mode,sizes --sharing --sizes-mib 2 --iterations 1
run abuse greedy,default_limits --abuse --seconds 1 --payload-mib 1 --greedy 2
run compute mode,batches --compute --layers 64,256,32 --batches 1,17 --rounds 2
run generate read_bandwidth_gbs,decode_tokens_per_s,decode_fraction_of_bandwidth,prefill_tokens_per_s,batch_vs_batch_1 \
  --generate --model-mib 1 --prompt 8 --tokens 4 --rounds 1 --batch 3
# Decode attention alone times the AVX-512 kernel; without AVX-512F it says so and stops.
if grep -qw avx512f /proc/cpuinfo; then
  run decode-attention f32 --generate --attention --prompt 64 --batch 2 --rounds 1
else
  echo "skipped: warmpool-bench --generate --attention (no AVX-512F here)"
fi
run pieces decode_ms,pieces --generate --pieces --model-mib 8 --prompt 64 --rounds 1
run embeddings alone_ms,grouped_ms,speedup --generate --embeddings --model-mib 8 --batch 8 --tokens 4 --rounds 1
run parked-generate prefill_ms,unpark_ms,parked_first_token_ms,first_token_vs_unpark_plus_prefill \
  --generate --parked --model-mib 8 --prompt 8 --rounds 1
run http-generate framed_tokens_per_s,sse_tokens_per_s,sse_vs_framed,first_token_overhead_ms \
  --generate --http --model-mib 8 --prompt 8 --tokens 4 --rounds 1
run stream-generate one_stream_tokens_per_s,streams_tokens_per_s,streams_vs_one,itl_p99_vs_median \
  --generate --streams 2 --model-mib 8 --prompt 8 --tokens 4 --rounds 1 --long-prompt 64
run second-turn first_turn_first_token_ms,second_turn_first_token_ms,second_vs_first,second_turn_cached_tokens \
  --generate --second-turn --model-mib 8 --tokens 4 --rounds 1 --long-prompt 200
run resume-generate kill_to_next_token_ms,itl_median_ms,kill_gap_vs_median,identical \
  --generate --resume --model-mib 8 --prompt 8 --tokens 8 --rounds 1
run batching batched,unbatched,batched_vs_unbatched --batching --clients 2 --requests 40 --rounds 1 --layers 64,128,64
run regions memcpy,region,in-place,frames,ratio_region_vs_memcpy --regions --payload-mib 2 --iterations 2
run restart mode,warm,cold,cold_vs_warm --restart --iterations 1 --model-mib 4
run switch mode,switch_ms,cat_ms,cat_vs_switch --switch --iterations 2 --model-mib 4
