#!/usr/bin/env bash
# The command line: demo JSON keys and targets, plan --explain rejections, errors.
set -euo pipefail
bin="$1"
fail() { echo "cli_test: $*" >&2; exit 1; }

json=$("$bin" demo --tokens 1200 --layers 1 --json)
python3 - "$json" <<'PY' || fail "demo --json report"
import json, sys
r = json.loads(sys.argv[1])
for k in ("model", "tokens", "device", "dtype", "naive", "planned", "floor_bytes", "error", "plan"):
    assert k in r, k
for k in ("peak_bytes", "ms"):
    assert isinstance(r["naive"][k], (int, float)), k
for k in ("peak_bytes", "estimated_peak_bytes", "ms"):
    assert isinstance(r["planned"][k], (int, float)), k
assert r["tokens"] == 1200
assert r["segments"] == {"text": 128, "video": 1072}, r["segments"]
assert r["error"]["rel_l2"] <= 1e-5, r["error"]
assert r["planned"]["peak_bytes"] < r["naive"]["peak_bytes"]
assert abs(r["planned"]["estimated_peak_bytes"] - r["planned"]["peak_bytes"]) <= 0.05 * r["planned"]["peak_bytes"]
PY

out=$("$bin" plan --explain --consumer whole --format int8-rowwise --chunk 256)
for s in "rejected by consumer 'whole': accepts bounded Q against global K/V [consumer.bounded_q] — required yes, actual undeclared" \
         "[x] bounded QKV" "[x] token-chunked MLP" "policy: default"; do
  grep -qF -- "$s" <<<"$out" || fail "plan --explain lacks: $s"
done
# The schedule program: as text, and in --explain --json with every rejection's code.
out=$("$bin" plan --program --layers 1 --chunk 1000)
for s in "program 0.attn:" "attend: attend (consumer 'sdpa')" "program 0.mlp:" "residual-add" "buffers:" "program final:"; do
  grep -qF -- "$s" <<<"$out" || fail "plan --program lacks: $s"
done
"$bin" plan --explain --json --layers 1 --consumer whole | python3 -c '
import json, sys
r = json.load(sys.stdin)
progs = {p["name"]: p for p in r["programs"]}
assert {"embed", "0.attn", "0.mlp", "final"} <= set(progs), list(progs)
a = progs["0.attn"]
assert a["arena_bytes"] > 0 and a["steps"] and a["buffers"], a.keys()
assert any(s["kind"] == "attend" for s in a["steps"])
codes = [x["code"] for s in r["plan"]["blocks"][0]["sublayers"] for d in s["transformations"] for x in d["rejections"]]
assert "consumer.bounded_q" in codes, codes' || fail "plan --explain --json programs and codes"
"$bin" plan --json --consumer whole --chunk 256 | python3 -c '
import json, sys
p = json.load(sys.stdin)["plan"]
t = {d["transformation"]: d for d in p["blocks"][0]["sublayers"][0]["transformations"]}
assert not t["global K/V + streamed Q"]["chosen"]
assert "whole" in t["global K/V + streamed Q"]["rejections"][0]["component"]
assert t["bounded QKV"]["chosen"]' || fail "plan --json rejection"

# Bad input: clear errors, nonzero status.
# Exit status 1 with the one error prefix for option errors too; --help and --version exit 0.
rc=0; err=$("$bin" demo --tokens 0 2>&1) || rc=$?
[ "$rc" -eq 1 ] || fail "--tokens 0: exit $rc, expected 1"
grep -qF "streamplan: error: --tokens: must be >= 1, got 0" <<<"$err" || fail "unexpected error: $err"
rc=0; err=$("$bin" plan --no-such-option 2>&1) || rc=$?
[ "$rc" -eq 1 ] || fail "unknown option: exit $rc, expected 1"
grep -q "^streamplan: error: .*--no-such-option" <<<"$err" || fail "unexpected error: $err"
# The int8 attention consumers are explicit choices: no CUDA device is an error, never a fallback.
for c in int8 sparse; do
  rc=0; err=$("$bin" demo --device cpu --tokens 300 --layers 1 --dtype bf16 --consumer $c 2>&1) || rc=$?
  [ "$rc" -eq 1 ] || fail "--consumer $c on the CPU: exit $rc, expected 1"
  grep -qF "streamplan: error: consumer '$c' (int8 attention kernels) needs a CUDA device" <<<"$err" || fail "unexpected error: $err"
done
rc=0; err=$("$bin" bench-attention --device cpu 2>&1) || rc=$?
[ "$rc" -eq 1 ] || fail "bench-attention on the CPU: exit $rc, expected 1"
rc=0; err=$("$bin" bench-attention --distribution peaky,uniform 2>&1) || rc=$?
[ "$rc" -eq 1 ] && grep -qF -- "--distribution: unknown 'uniform'" <<<"$err" || fail "bench-attention --distribution uniform: exit $rc: $err"
out=$("$bin" demo --help) || fail "demo --help failed"
# CLI11 versions print a default as "INT=3200" or "INT [3200]".
grep -qE -- "--tokens INT( \[|=)3200" <<<"$out" && grep -qE -- "--consumer .*(=| \[)sdpa" <<<"$out" || fail "demo --help shows no defaults: $out"
out=$("$bin" --version) || fail "--version failed"
grep -qE "^streamplan [0-9]+\.[0-9]+\.[0-9]+$" <<<"$out" && grep -qE "^build: (CUDA|CPU)" <<<"$out" &&
  grep -qE "^torch: [0-9]" <<<"$out" || fail "unexpected --version: $out"
if err=$("$bin" demo --tokens 100 2>&1); then fail "--tokens 100 should fail"; fi
grep -q "leaves no video tokens after 128 text tokens" <<<"$err" || fail "unexpected error: $err"
if err=$("$bin" plan --consumer nope 2>&1); then fail "--consumer nope should fail"; fi
grep -q "consumer" <<<"$err" || fail "unexpected error: $err"
if err=$("$bin" plan --feature-slice 100 --format int8-rowwise 2>&1); then fail "misaligned slice should fail"; fi
grep -q "not a multiple of the weight formats' alignment 256" <<<"$err" || fail "unexpected error: $err"
# Budgets: an infeasible one exits 2 naming the smallest peak; a feasible one is met.
set +e
err=$("$bin" demo --device cpu --tokens 1200 --layers 1 --budget 1MiB 2>&1); rc=$?
set -e
[ "$rc" -eq 2 ] || fail "infeasible budget: exit $rc, expected 2"
grep -q "is below the smallest achievable peak" <<<"$err" || fail "unexpected budget error: $err"
"$bin" demo --device cpu --tokens 1200 --layers 1 --budget 6MiB --json | python3 -c '
import json, sys
r = json.load(sys.stdin)
assert r["plan"]["budget_bytes"] == 6 << 20, r["plan"]["budget_bytes"]
assert r["planned"]["peak_bytes"] <= 6 << 20, r["planned"]
assert r["planned"]["estimated_peak_bytes"] <= 6 << 20' || fail "budget 6MiB not met"
if err=$("$bin" demo --budget 12 parsecs 2>&1); then fail "bad budget should fail"; fi
# Checkpoints: a tiny avdit written and run with outputs; malformed and unrecognized files named.
corpus="$(dirname "$0")/../fuzz/corpus"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bin" make-checkpoint --family avdit --tiny --layers 1 --out "$tmp/avdit.safetensors" >/dev/null
"$bin" run --device cpu --checkpoint "$tmp/avdit.safetensors" --frames 2 --height 64 --width 96 --text-tokens 5 --audio-tokens 3 \
  --output "$tmp/out.safetensors" --json | python3 -c '
import json, sys
r = json.load(sys.stdin)
assert r["error"]["rel_l2"] <= 1e-5, r["error"]
s = r["segments"]
assert s["text"] == 5 and s["audio"] == 3 and sum(s.values()) == r["tokens"], s' || fail "run on a tiny avdit checkpoint"
[ -s "$tmp/out.safetensors" ] || fail "run --output wrote nothing"
# The text and audio tokens a run adds to --tokens are shown, per segment.
out=$("$bin" run --device cpu --checkpoint "$tmp/avdit.safetensors" --tokens 20 --text-tokens 5 --audio-tokens 3 --planned-only)
grep -qF "tokens: 28 = video 20 + text 5 + audio 3" <<<"$out" || fail "run shows no token breakdown: $out"
# --explain names each linear's format, why, and the GEMM that runs it (the CPU: the dequantized reference).
out=$("$bin" run --device cpu --checkpoint "$tmp/avdit.safetensors" --tokens 20 --planned-only --precision int8 --explain)
grep -qE ": int8 \(.*--precision int8.*\); GEMM: dequantized slice, then a matmul" <<<"$out" \
  || fail "run --explain lacks the linears' formats and GEMMs: $out"
# bench on a CPU warns that it is meant for a GPU and estimates its time.
err=$("$bin" bench --device cpu --cases flux-dev-1024 --reps 1 --estimate 2>&1 >"$tmp/estimate.txt") || fail "bench --estimate failed"
grep -qF "streamplan: warning: bench is meant for a GPU" <<<"$err" || fail "bench on the CPU did not warn: $err"
grep -qE "^total: about [0-9.]+ (s|min|h|days)( [0-9]+ (s|min))? on the CPU" "$tmp/estimate.txt" || fail "bench --estimate: $(cat "$tmp/estimate.txt")"
# bench --format runs the case in bf16 first on the same weights: its time and the error against it.
"$bin" bench --device cpu --tiny --cases wan-block-tiny --format int8 --reps 1 --quiet --out "$tmp/format.json" \
  >"$tmp/format.txt" 2>/dev/null || fail "bench --format failed"
python3 -c 'import json, sys; r = json.load(open(sys.argv[1]))[0]
assert r["format"] == "int8" and r["bf16_ms"] > 0 and 0 < r["rel_l2_vs_bf16"] < 3e-2, r' "$tmp/format.json" \
  || fail "bench --format: $(cat "$tmp/format.json")"
grep -qE "int8 \+ sdpa [0-9.]+ ms vs bf16 dense [0-9.]+ ms" "$tmp/format.txt" || fail "bench --format table: $(cat "$tmp/format.txt")"
# A checkpoint larger than the free space is refused before anything is written, naming both
# sizes; the test-only STREAMPLAN_FREE_BYTES_FOR_TESTS stands in for a full disk.
size=$(wc -c <"$tmp/avdit.safetensors")
if err=$(STREAMPLAN_FREE_BYTES_FOR_TESTS=100000 "$bin" make-checkpoint --family avdit --tiny --layers 1 \
  --out "$tmp/full.safetensors" 2>&1); then fail "make-checkpoint beyond the free space accepted"; fi
grep -qF "the file needs $size bytes" <<<"$err" && grep -qF "has 100000 bytes" <<<"$err" || fail "unexpected error: $err"
[ ! -e "$tmp/full.safetensors" ] && [ ! -e "$tmp/full.safetensors.tmp" ] || fail "refused make-checkpoint left a file"
# Files that are not safetensors at all are called that, by name.
printf '{"num_layers": 30}\n' >"$tmp/config.json"
if err=$("$bin" run --checkpoint "$tmp/config.json" --tokens 10 2>&1); then fail "JSON checkpoint accepted"; fi
grep -qF "'$tmp/config.json' is not a safetensors file: it looks like a JSON document" <<<"$err" || fail "unexpected error: $err"
if err=$("$bin" run --checkpoint "$corpus/bad_overlap.safetensors" --tokens 10 2>&1); then fail "malformed checkpoint accepted"; fi
grep -q "overlaps tensor 'a'" <<<"$err" || fail "unexpected error: $err"
if err=$("$bin" run --checkpoint "$corpus/valid_small.safetensors" --tokens 10 2>&1); then fail "unknown checkpoint accepted"; fi
grep -q "unrecognized checkpoint" <<<"$err" || fail "unexpected error: $err"
if err=$("$bin" run --device cpu --checkpoint "$tmp/avdit.safetensors" --frames 2 --height 60 --width 96 2>&1); then fail "bad geometry accepted"; fi
grep -q "multiples of 32, got 2x60x96" <<<"$err" || fail "unexpected error: $err"
# Under --device-memory: a size too small exits 2 naming the smallest that works; that size runs,
# with blocks streamed, the output equal to the all-resident run's.
"$bin" make-checkpoint --family avdit --tiny --layers 4 --out "$tmp/avdit4.safetensors" >/dev/null 2>&1 ||
  fail "make-checkpoint of 4 layers failed"
rc=0
err=$("$bin" run --device cpu --checkpoint "$tmp/avdit4.safetensors" --tokens 40 --device-memory 64KiB --quiet 2>&1) || rc=$?
[ "$rc" -eq 2 ] || fail "device memory too small: exit $rc, expected 2 ($err)"
smallest=$(sed -n 's/.*the smallest device memory that works is \([0-9.]*\) MiB.*/\1/p' <<<"$err")
[ -n "$smallest" ] || fail "unexpected device-memory error: $err"
smallest=$(awk -v m="$smallest" 'BEGIN { printf "%.2f", m + 0.01 }')  # the message rounds to 0.01 MiB
"$bin" run --device cpu --checkpoint "$tmp/avdit4.safetensors" --tokens 40 --device-memory "${smallest}MiB" --planned-only \
  --output "$tmp/streamed.safetensors" --json --quiet | python3 -c '
import json, sys
r = json.load(sys.stdin)["residency"]
assert r["streamed_blocks"] and r["planned_device_bytes"] <= r["device_memory_bytes"], r' || fail "run at the smallest device memory"
"$bin" run --device cpu --checkpoint "$tmp/avdit4.safetensors" --tokens 40 --planned-only --output "$tmp/resident.safetensors" \
  --quiet >/dev/null || fail "all-resident run failed"
cmp -s "$tmp/streamed.safetensors" "$tmp/resident.safetensors" || fail "streamed and all-resident outputs differ"
# plan --device-memory with --ranks: sharded weights on request, within the memory, the shares
# planned; the arrangement needs a checkpoint; sharding needs ranks.
"$bin" plan --device cpu --checkpoint "$tmp/avdit4.safetensors" --tokens 40 --ranks 2 --weights sharded \
  --device-memory 1GiB --json --quiet | python3 -c '
import json, sys
d = json.load(sys.stdin)
r = d["residency"]
assert r["sharded"] and r["ranks"] == 2 and r["shard_bytes"] > 0 and r["planned_device_bytes"] <= r["device_memory_bytes"], r
assert "sharded over the ranks" in r["why"] and "taken" in r["why"], r["why"]' || fail "plan --ranks 2 --weights sharded"
out=$("$bin" plan --device cpu --checkpoint "$tmp/avdit4.safetensors" --tokens 40 --ranks 2 --device-memory 1GiB --quiet)
grep -qF "weighed: replicated, every block on each rank: " <<<"$out" || fail "plan --ranks --device-memory: $out"
if err=$("$bin" plan --device-memory 1GiB 2>&1); then fail "plan --device-memory without a checkpoint accepted"; fi
grep -qF "streamplan: error: --device-memory: applies with --checkpoint only" <<<"$err" || fail "unexpected error: $err"
if err=$("$bin" plan --device cpu --checkpoint "$tmp/avdit4.safetensors" --tokens 40 --weights sharded 2>&1); then
  fail "plan --weights sharded on one rank accepted"
fi
grep -qF "streamplan: error: --weights sharded: shares the weights over the ranks of --ranks 2 or more" <<<"$err" ||
  fail "unexpected error: $err"
# plan --ranks: every rank's plan trades the same exchange slabs, whatever rows it holds (an H3
# whose first rank holds text rows only).
"$bin" make-checkpoint --family minimax-h3 --tiny --layers 1 --out "$tmp/h3.safetensors" >/dev/null 2>&1 ||
  fail "make-checkpoint minimax-h3 failed"
# Both read the same device rates: one probe cached first where nothing else writes. A probe
# that does not trust its figures (other processes busy, as under ctest -j2) caches nothing, so
# then its figures are cached here, as the probe would have.
ranks_cache="$tmp/ranks-cache"
mkdir -p "$ranks_cache"
XDG_CACHE_HOME="$ranks_cache" "$bin" probe --device cpu --json >"$tmp/probe.json" || fail "probe for plan --ranks"
python3 - "$tmp/probe.json" <<'PY' || fail "caching the probe for plan --ranks"
import json, os, sys
r = json.load(open(sys.argv[1]))
if not r["cached"]:
    for k in ("attempts", "cache_path", "cached", "from_cache", "other_cores", "untrusted"):
        r.pop(k)
    path = json.load(open(sys.argv[1]))["cache_path"]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    json.dump(r, open(path, "w"))
PY
for r in 0 1; do
  XDG_CACHE_HOME="$ranks_cache" "$bin" plan --device cpu --checkpoint "$tmp/h3.safetensors" --frames 3 --height 64 --width 96 --audio-tokens 17 \
    --text-tokens 512 --ranks 2 --rank $r --json --quiet >"$tmp/rank$r.json" || fail "plan --ranks 2 --rank $r"
done
python3 - "$tmp/rank0.json" "$tmp/rank1.json" <<'PY' || fail "plan --ranks: the ranks' exchange slabs differ"
import json, sys
a, b = (json.load(open(f))["plan"]["sequence"] for f in sys.argv[1:])
assert a["exchange_slabs"] and a["exchange_slabs"] == b["exchange_slabs"], (a, b)
assert (a["rank"], b["rank"], a["ranks"], a["mode"]) == (0, 1, 2, "ulysses"), (a, b)
PY
# run --nproc: sequence parallel over ranks this command starts (gloo on the CPU); rank 0
# compares with the forward in one process (--check). Flux's first rank holds text rows only,
# none of the rows the final layer projects; the H3 ring over 3 ranks splits 56 heads unevenly.
"$bin" make-checkpoint --family flux1-dev --tiny --layers 1 --out "$tmp/flux.safetensors" >/dev/null 2>&1 ||
  fail "make-checkpoint flux1-dev failed"
"$bin" make-checkpoint --family wan2.1-1.3b --tiny --layers 2 --out "$tmp/wan.safetensors" >/dev/null 2>&1 ||
  fail "make-checkpoint wan2.1-1.3b failed"
while read -r ckpt ranks extra; do
  "$bin" run --checkpoint "$tmp/$ckpt.safetensors" --device cpu --nproc "$ranks" $extra --check --json \
    --quiet >"$tmp/ranks.json" || fail "run --nproc $ranks $extra of $ckpt"
  python3 - "$tmp/ranks.json" "$ranks" <<'PY' || fail "run --nproc $ranks $extra of $ckpt: $(head -c 600 "$tmp/ranks.json")"
import json, sys
r, n = json.load(open(sys.argv[1])), int(sys.argv[2])
assert [x["rank"] for x in r["ranks"]] == list(range(n)) and all(x["ms"] > 0 and x["peak_bytes"] > 0 for x in r["ranks"])
assert r["rel_l2_vs_one_process"] <= 1e-5, r["rel_l2_vs_one_process"]
assert r["plan"]["sequence"]["ranks"] == n
PY
done <<'CASES'
wan 2 --sequence=ulysses --frames=5 --height=32 --width=48
wan 4 --sequence=ring --frames=5 --height=32 --width=48
wan 2 --weights=sharded --frames=5 --height=32 --width=48
flux 2 --sequence=ulysses --height=64 --width=48
h3 3 --sequence=ring --frames=5 --height=32 --width=32
CASES
# run --nproc with a LoRA: the ranks apply it as one process does (rel L2 against the native run
# with the LoRA, and the LoRA changes the output).
python3 - "$tmp/wan.safetensors" "$tmp/wan_lora.safetensors" <<'PY' || fail "writing a LoRA for the tiny Wan"
import json, random, struct, sys
src = open(sys.argv[1], "rb")
head = json.loads(src.read(struct.unpack("<Q", src.read(8))[0]))
random.seed(3)
header, data = {}, b""
for w in ("blocks.0.self_attn.q", "blocks.1.self_attn.k", "blocks.1.ffn.0", "blocks.0.cross_attn.o"):
    out_f, in_f = head[w + ".weight"]["shape"]
    for part, shape in (("lora_A", [4, in_f]), ("lora_B", [out_f, 4])):
        n = shape[0] * shape[1]
        header[f"diffusion_model.{w}.{part}.weight"] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data) + 4 * n]}
        data += struct.pack(f"<{n}f", *(random.gauss(0, 0.1) for _ in range(n)))
h = json.dumps(header).encode()
open(sys.argv[2], "wb").write(struct.pack("<Q", len(h)) + h + data)
PY
wan_geom=(--checkpoint "$tmp/wan.safetensors" --frames 5 --height 32 --width 48 --device cpu --quiet)
"$bin" run "${wan_geom[@]}" --nproc 2 --lora "$tmp/wan_lora.safetensors" --check --json --output "$tmp/nproc_lora.safetensors" \
  >"$tmp/ranks.json" || fail "run --nproc 2 --lora"
"$bin" run "${wan_geom[@]}" --lora "$tmp/wan_lora.safetensors" --output "$tmp/one_lora.safetensors" >/dev/null ||
  fail "run --lora"
"$bin" run "${wan_geom[@]}" --nproc 2 --precision preserve --output "$tmp/nproc.safetensors" >/dev/null || fail "run --nproc 2"
python3 - "$tmp/ranks.json" "$tmp/nproc_lora.safetensors" "$tmp/one_lora.safetensors" "$tmp/nproc.safetensors" <<'PY' ||
import json, math, struct, sys
r = json.load(open(sys.argv[1]))
assert r["lora"] == {"adapters": 4, "unmatched": [], "unapplied": []}, r["lora"]
assert r["rel_l2_vs_one_process"] <= 1e-5, r["rel_l2_vs_one_process"]
def output(path):  # the fp32 tensor "output" of a safetensors file
    raw = open(path, "rb").read()
    size = struct.unpack("<Q", raw[:8])[0]
    t = json.loads(raw[8:8 + size])["output"]
    assert t["dtype"] == "F32", t
    a, b = t["data_offsets"]
    return struct.unpack(f"<{(b - a) // 4}f", raw[8 + size + a:8 + size + b])
def rel(x, y):
    return math.sqrt(sum((p - q) ** 2 for p, q in zip(x, y)) / sum(q * q for q in y))
ranks, one, plain = (output(p) for p in sys.argv[2:])
assert rel(ranks, one) <= 1e-5, rel(ranks, one)
assert rel(plain, one) >= 1e-3, rel(plain, one)
PY
  fail "run --nproc --lora: $(head -c 600 "$tmp/ranks.json")"
# --precision over the ranks: the weights converted once for all of them, as one process
# converts them at load (the same output); the temporary copy gone afterwards.
"$bin" run "${wan_geom[@]}" --nproc 2 --precision int8 --output "$tmp/nproc_int8.safetensors" >/dev/null ||
  fail "run --nproc 2 --precision int8"
"$bin" run "${wan_geom[@]}" --precision int8 --planned-only --output "$tmp/one_int8.safetensors" >/dev/null ||
  fail "run --precision int8"
python3 - "$tmp/nproc_int8.safetensors" "$tmp/one_int8.safetensors" "$tmp/nproc.safetensors" <<'PY' ||
import json, math, struct, sys
def output(path):  # the fp32 tensor "output" of a safetensors file
    raw = open(path, "rb").read()
    size = struct.unpack("<Q", raw[:8])[0]
    a, b = json.loads(raw[8:8 + size])["output"]["data_offsets"]
    return struct.unpack(f"<{(b - a) // 4}f", raw[8 + size + a:8 + size + b])
def rel(x, y):
    return math.sqrt(sum((p - q) ** 2 for p, q in zip(x, y)) / sum(q * q for q in y))
ranks, one, preserved = (output(p) for p in sys.argv[1:])
assert rel(ranks, one) <= 1e-5, rel(ranks, one)
assert rel(ranks, preserved) >= 1e-3, rel(ranks, preserved)  # int8 weights, not the stored ones
PY
  fail "run --nproc 2 --precision int8: its output against one process's"
! ls "${TMPDIR:-/tmp}"/streamplan-ranks-* >/dev/null 2>&1 || fail "run --nproc --precision left its converted copy"
rc=0; err=$(RANK=0 WORLD_SIZE=1 MASTER_PORT=1 "$bin" run "${wan_geom[@]}" --precision int8 2>&1) || rc=$?
[ "$rc" -eq 1 ] && grep -qF -- "--precision int8: under torchrun each process is one rank" <<<"$err" ||
  fail "run --precision under torchrun: $rc $err"
# The ranks' consumer and its options are checked once, before any rank starts.
rc=0; err=$("$bin" run "${wan_geom[@]}" --nproc 2 --consumer sparse --kv-budget 0.3 2>&1) || rc=$?
[ "$rc" -eq 1 ] && [ "$(grep -c "consumer 'sparse' (int8 attention kernels) needs a CUDA device" <<<"$err")" -eq 1 ] ||
  fail "run --nproc --consumer sparse on the CPU: $rc $err"
rc=0; err=$("$bin" run "${wan_geom[@]}" --nproc 2 --kv-budget 0.3 2>&1) || rc=$?
[ "$rc" -eq 1 ] && [ "$(grep -c -- "--kv-budget 0.3: applies to --consumer sparse only" <<<"$err")" -eq 1 ] ||
  fail "run --nproc --kv-budget without sparse: $rc $err"
# ... as the message says: a converted checkpoint runs over the ranks.
"$bin" convert "$tmp/wan.safetensors" "$tmp/wan_int8.safetensors" --to int8 >/dev/null 2>&1 || fail "convert --to int8"
"$bin" run --checkpoint "$tmp/wan_int8.safetensors" --frames 5 --height 32 --width 48 --device cpu --quiet --nproc 2 \
  --check --json >"$tmp/ranks.json" || fail "run --nproc 2 of an int8 checkpoint"
python3 - "$tmp/ranks.json" <<'PY' || fail "run --nproc 2 of an int8 checkpoint: $(head -c 600 "$tmp/ranks.json")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["rel_l2_vs_one_process"] <= 1e-5, r["rel_l2_vs_one_process"]
PY
rc=0; err=$("$bin" run --checkpoint "$tmp/wan.safetensors" --frames 5 --height 32 --width 48 --device cpu \
  --sequence ring 2>&1) || rc=$?
[ "$rc" -eq 1 ] && grep -qF -- "--sequence: applies to sequence-parallel runs (--nproc)" <<<"$err" ||
  fail "run --sequence without --nproc: $rc $err"
# --link-rate: the plans price the exchanges at the rate given instead of the measured (run) or
# default (plan) one; it prices exchanges between ranks, so needs them.
out=$("$bin" run "${wan_geom[@]}" --nproc 2 --link-rate 7 --explain) || fail "run --nproc 2 --link-rate 7"
grep -qF " at 7 GB/s" <<<"$out" || fail "run --nproc 2 --link-rate 7: the plan does not say the rate: $out"
out=$("$bin" plan --checkpoint "$tmp/wan.safetensors" --frames 5 --height 32 --width 48 --device cpu --quiet \
  --ranks 2 --link-rate 7) || fail "plan --ranks 2 --link-rate 7"
grep -qF " at 7 GB/s" <<<"$out" || fail "plan --ranks 2 --link-rate 7: the plan does not say the rate: $out"
rc=0; err=$("$bin" run "${wan_geom[@]}" --link-rate 7 2>&1) || rc=$?
[ "$rc" -eq 1 ] && grep -qF -- "--link-rate: applies to sequence-parallel runs (--nproc)" <<<"$err" ||
  fail "run --link-rate without --nproc: $rc $err"
rc=0; err=$("$bin" plan --device cpu --quiet --link-rate 7 2>&1) || rc=$?
[ "$rc" -eq 1 ] && grep -qF -- "--link-rate 7: prices the exchanges between ranks, so applies with --ranks 2 or more" \
  <<<"$err" || fail "plan --link-rate without --ranks: $rc $err"
rc=0; err=$(RANK=0 WORLD_SIZE=2 "$bin" run --checkpoint "$tmp/wan.safetensors" --frames 5 --height 32 --width 48 \
  --device cpu 2>&1) || rc=$?
[ "$rc" -eq 1 ] && grep -qF "MASTER_PORT: unset, while RANK is set" <<<"$err" || fail "RANK without MASTER_PORT: $rc $err"
# probe: measures and caches (where trusted), --show reads the cache, --reset clears it.
probe_home="$tmp/probe-cache"
mkdir -p "$probe_home"
out=$(XDG_CACHE_HOME="$probe_home" "$bin" probe --show --device cpu)
grep -q "no cached rates for cpu-" <<<"$out" || fail "probe --show without a cache: $out"
out=$(XDG_CACHE_HOME="$probe_home" "$bin" probe --device cpu)
grep -q "attention_ratio" <<<"$out" || fail "probe: $out"
if grep -q "cached in" <<<"$out"; then
  XDG_CACHE_HOME="$probe_home" "$bin" probe --show --device cpu | grep -q "from the cache" || fail "probe --show after probe"
  XDG_CACHE_HOME="$probe_home" "$bin" probe --reset --device cpu | grep -q "^removed " || fail "probe --reset"
else
  grep -q "not cached: " <<<"$out" || fail "probe neither cached nor said why: $out"
fi
XDG_CACHE_HOME="$probe_home" "$bin" probe --show --device cpu | grep -q "no cached rates" || fail "probe --show after --reset"
rc=0; err=$("$bin" probe --show --reset 2>&1) || rc=$?
[ "$rc" -eq 1 ] || fail "probe --show --reset: exit $rc, expected 1 ($err)"
echo "cli_test: ok"
