#!/usr/bin/env bash
# A real Prometheus (Debian's `prometheus`) scrapes a real warmpoold, using the sample scrape job
# of systemd/prometheus-scrape.yml; the series are then read back through Prometheus's own HTTP
# API and checked against what this script did. `promtool check metrics` must pass on /metrics.
#   scrape_test.sh BUILD_BIN_DIR SOURCE_DIR
set -euo pipefail
bin=$1
src=$2
python=/usr/bin/python3
command -v prometheus >/dev/null || { echo "prometheus is not installed (scripts/install-deps.sh --test)"; exit 1; }

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wp_port=$(free_port)
prom_port=$(free_port)
sock=$work/warmpool.sock
mkdir "$work/models"
"$bin/warmpool-mkmodel" "$work/models/tiny.safetensors" --layers 4,8,3 --activation relu >/dev/null
"$bin/warmpoold" --socket "$sock" --models-dir "$work/models" --instance "prom$$" \
  --http "127.0.0.1:$wp_port" >"$work/warmpoold.log" 2>&1 &
pids+=($!)
"$bin/warmpool" --socket "$sock" status --wait 10s >/dev/null

# What the series must say: 1 load from the file, 7 inferences answered OK and 2 refused
# (a row of the wrong width), 1 explicit unload.
"$bin/warmpool" --socket "$sock" load tiny >/dev/null
for _ in $(seq 7); do "$bin/warmpool" --socket "$sock" infer tiny --random 2 >/dev/null; done
for _ in $(seq 2); do
  if echo '[[1, 2]]' | "$bin/warmpool" --socket "$sock" infer tiny --input - >/dev/null 2>&1; then
    echo "FAIL: an input of the wrong width was accepted"; exit 1
  fi
done
"$bin/warmpool" --socket "$sock" unload tiny >/dev/null

curl -sf "http://127.0.0.1:$wp_port/metrics" >"$work/metrics.txt"
promtool check metrics <"$work/metrics.txt"

# The shipped scrape job, pointed at this daemon and scraping every second.
sed -e "s/127.0.0.1:9464/127.0.0.1:$wp_port/" -e "s/scrape_interval: 15s/scrape_interval: 1s/" \
  "$src/systemd/prometheus-scrape.yml" >"$work/prometheus.yml"
promtool check config "$work/prometheus.yml" >/dev/null
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$prom_port" --log.level=warn >"$work/prometheus.log" 2>&1 &
pids+=($!)

"$python" - "$prom_port" <<'PY'
import json, sys, time, urllib.parse, urllib.request

port = sys.argv[1]
expected = {
    'up{job="warmpool"}': 1,
    'warmpool_model_requests_total{model="tiny",request="infer",code="OK"}': 7,
    'warmpool_model_requests_total{model="tiny",request="infer",code="INVALID_ARGUMENT"}': 2,
    'warmpool_model_requests_total{model="tiny",request="load",code="OK"}': 1,
    'warmpool_model_requests_total{model="tiny",request="unload",code="OK"}': 1,
    'warmpool_model_inference_duration_seconds_count{model="tiny"}': 9,
    'warmpool_model_queue_wait_seconds_count{model="tiny"}': 9,  # the worker refuses the width
    'warmpool_model_loads_total{model="tiny",source="file"}': 1,
    'warmpool_model_loads_total{model="tiny",source="unpark"}': 0,
    'warmpool_model_load_duration_seconds_count{model="tiny"}': 1,
    'warmpool_model_releases_total{model="tiny",reason="explicit"}': 1,
    'warmpool_model_releases_total{model="tiny",reason="budget"}': 0,
    'warmpool_model_state{model="tiny",state="registered"}': 1,
    'warmpool_model_state{model="tiny",state="ready"}': 0,
    'warmpool_device_used_bytes{device="0"}': 0,
    'warmpool_inflight_requests': 0,
    'warmpool_queued_requests': 0,
    'count(warmpool_build_info{version!=""})': 1,
}
checks = {'warmpool_workers_up': lambda v: v >= 1, 'warmpool_device_budget_bytes{device="0"}': lambda v: v > 0}

def query(q):
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": q})
    with urllib.request.urlopen(url, timeout=5) as r:
        doc = json.load(r)
    result = doc["data"]["result"]
    return None if not result else float(result[0]["value"][1])

deadline = time.time() + 60
last = {}
while time.time() < deadline:
    try:
        last = {q: query(q) for q in list(expected) + list(checks)}
    except OSError:
        time.sleep(0.5)
        continue
    if all(last[q] == v for q, v in expected.items()) and all(f(last[q]) for q, f in checks.items() if last[q] is not None) \
            and all(last[q] is not None for q in checks):
        print(f"prometheus scraped warmpoold: {len(last)} series as expected")
        sys.exit(0)
    time.sleep(0.5)
for q, v in expected.items():
    if last.get(q) != v:
        print(f"FAIL: {q} = {last.get(q)}, expected {v}")
for q in checks:
    print(f"{q} = {last.get(q)}")
sys.exit(1)
PY
