#!/usr/bin/env bash
# The command line as a new user meets it: convert -> run round trips for every format and
# layout, option conflicts and irrelevant options, misleading messages, outputs checked before
# any work, interrupted writes, feasibility before running, the plan of a checkpoint.
set -euo pipefail
bin="$1"
fail() { echo "cli_user_test: $*" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# expect STATUS TEXT -- COMMAND...: the command exits with STATUS and its stderr holds TEXT.
expect() {
  local want="$1" text="$2" rc=0 err
  shift 3
  err=$("$@" 2>&1 >/dev/null) || rc=$?
  [ "$rc" -eq "$want" ] || fail "$*: exit $rc, expected $want ($err)"
  grep -qF -- "$text" <<<"$err" || fail "$*: stderr lacks '$text': $err"
}

"$bin" make-checkpoint --family flux1-schnell --tiny --out "$tmp/fs.safetensors" >/dev/null
"$bin" make-checkpoint --family wan2.1-1.3b --tiny --out "$tmp/wan.safetensors" >/dev/null

# A Flux checkpoint written by convert runs, in every format and layout, and agrees with the
# dense file within the format's error (the modulation linears dequantized at load).
for spec in "fp8 comfy_quant" "int8 comfy_quant" "fp8 scaled_fp8" "fp8 plain" "fp8-e5m2 plain"; do
  set -- $spec
  out="$tmp/fs.$1.$2.safetensors"
  "$bin" convert --to "$1" --layout "$2" "$tmp/fs.safetensors" "$out" >/dev/null || fail "convert --to $1 --layout $2"
  "$bin" run --checkpoint "$out" --height 64 --width 64 --planned-only --json --quiet >"$tmp/r.json" \
    || fail "run of a Flux checkpoint converted to $1 ($2)"
  python3 - "$tmp/r.json" "$1" <<'PY' || fail "run of $1 ($2): $(cat "$tmp/r.json")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["nonfinite"] == 0, r["nonfinite"]
formats = {f["format"] for f in r["formats"]}
assert any(f.startswith(sys.argv[2].split("-")[0]) for f in formats), formats
PY
done

# convert: nothing to convert is an error with the reasons; the output may not be the input.
expect 1 "nothing in $tmp/wan.safetensors would be converted to convrot-int8" -- \
  "$bin" convert --to convrot-int8 "$tmp/wan.safetensors" "$tmp/w.safetensors"
expect 1 "in_features 64 is not a multiple of 256" -- \
  "$bin" convert --to convrot-int8 "$tmp/wan.safetensors" "$tmp/w.safetensors"
before=$(sha256sum <"$tmp/wan.safetensors")
expect 1 "is the input file IN" -- "$bin" convert --to fp8 "$tmp/wan.safetensors" "$tmp/wan.safetensors"
ln -s "$tmp/wan.safetensors" "$tmp/link.safetensors"
expect 1 "is the input file IN" -- "$bin" convert --to fp8 "$tmp/wan.safetensors" "$tmp/link.safetensors"
[ "$(sha256sum <"$tmp/wan.safetensors")" = "$before" ] || fail "convert IN IN changed its input"
expect 1 "--layout scaled_fp8" -- "$bin" convert --to int8 --layout scaled_fp8 "$tmp/wan.safetensors" "$tmp/w.safetensors"

# Output paths are checked before any work; disk space before make-checkpoint and convert.
expect 1 "does not exist" -- "$bin" run --checkpoint "$tmp/wan.safetensors" --tokens 64 --output /nonexistent/o.safetensors
expect 1 "is a directory" -- "$bin" convert --to fp8 "$tmp/wan.safetensors" "$tmp"
expect 1 "does not exist" -- "$bin" make-checkpoint --family avdit --tiny --out /nonexistent/a.safetensors
expect 1 "has 1000 bytes" -- env STREAMPLAN_FREE_BYTES_FOR_TESTS=1000 \
  "$bin" convert --to fp8 "$tmp/wan.safetensors" "$tmp/full.safetensors"
[ ! -e "$tmp/full.safetensors" ] && [ ! -e "$tmp/full.safetensors.tmp" ] || fail "refused convert left a file"

# An interrupted make-checkpoint leaves no temp file (SIGINT and SIGTERM). The write is slowed
# by size only: a model big enough to take a while on any machine. Job control on, so that the
# background job does not start with SIGINT ignored, as a script's background jobs do.
set -m
for sig in INT TERM; do
  out="$tmp/big-$sig.safetensors"
  "$bin" make-checkpoint --family wan2.1-1.3b --layers 6 --dtype fp32 --out "$out" --quiet &
  pid=$!
  for _ in $(seq 100); do [ -e "$out.tmp" ] && break; sleep 0.1; done
  [ -e "$out.tmp" ] || fail "make-checkpoint made no temp file to interrupt"
  kill -"$sig" "$pid"
  rc=0; wait "$pid" || rc=$?
  [ "$rc" -ne 0 ] || fail "make-checkpoint finished before SIG$sig: make the model bigger"
  [ ! -e "$out.tmp" ] && [ ! -e "$out" ] || fail "SIG$sig left $(ls "$tmp")"
done
set +m

# Conflicting and irrelevant options are errors naming them.
expect 1 "give --tokens (video tokens in one row) or the geometry, not both" -- \
  "$bin" run --checkpoint "$tmp/wan.safetensors" --tokens 64 --height 64
expect 1 "--audio-tokens 4: wan2.1-tiny has no audio tokens" -- \
  "$bin" run --checkpoint "$tmp/wan.safetensors" --tokens 64 --audio-tokens 4
expect 1 "--kv-budget 0.3: applies to --consumer sparse only" -- \
  "$bin" run --checkpoint "$tmp/wan.safetensors" --tokens 64 --kv-budget 0.3
expect 1 "--step 5 and --steps 2" -- \
  "$bin" run --checkpoint "$tmp/wan.safetensors" --tokens 64 --step 5 --steps 2 --consumer sparse
expect 1 "--feature-slice: must be >= 1, or -1" -- "$bin" run --checkpoint "$tmp/wan.safetensors" --tokens 64 --feature-slice 0
expect 1 "--feature-slice: must be >= 1, or -1" -- "$bin" demo --feature-slice 0
expect 1 "applies with --checkpoint only" -- "$bin" plan --height 64

# Messages that say what is wrong.
expect 1 "unknown subcommand 'rn' (did you mean 'run'?); the commands are demo, plan, run" -- "$bin" rn
expect 1 "strength 'abc' is not a number in '$tmp/wan.safetensors:abc'" -- \
  "$bin" run --checkpoint "$tmp/wan.safetensors" --tokens 64 --lora "$tmp/wan.safetensors:abc"
expect 2 "budget 1.00 KiB is below the smallest achievable peak" -- "$bin" demo --budget 1KiB --quiet
python3 - "$tmp/lora.safetensors" <<'PY'
import json, struct, sys
names = ["diffusion_model.blocks.0.self_attn.q.lora_A.weight", "diffusion_model.blocks.0.self_attn.q.lora_B.weight"]
header, data = {}, b""
for n, shape in zip(names, ([4, 64], [64, 4])):
    header[n] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data) + 4 * 256]}
    data += b"\0" * (4 * 256)
h = json.dumps(header).encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + data)
PY
expect 1 "looks like a LoRA (lora_A/lora_down tensors); pass it with --lora" -- \
  "$bin" run --checkpoint "$tmp/lora.safetensors" --tokens 64
out=$("$bin" run --checkpoint "$tmp/wan.safetensors" --tokens 64 --planned-only --precision int8 --explain --quiet)
grep -qF "(--precision int8)" <<<"$out" || fail "--precision int8 not named in --explain: $out"
if grep -qF "(--precision preserve)" <<<"$out"; then fail "--precision int8 labelled preserve: $out"; fi

# Infeasible geometries exit 2 before any weight is read, naming the floor; the suggested
# options do not loop back to the same error.
for extra in "" "--budget auto --planned-only"; do
  # shellcheck disable=SC2086
  expect 2 "cannot fit: the smallest achievable peak" -- timeout 60 \
    "$bin" run --checkpoint "$tmp/wan.safetensors" --tokens 2000000000 --quiet $extra
done
err=$(timeout 60 "$bin" run --checkpoint "$tmp/wan.safetensors" --tokens 2000000000 --quiet 2>&1 || true)
grep -qF "(floor " <<<"$err" || fail "no floor named: $err"
if grep -qE -- "--budget auto|--planned-only" <<<"$err"; then fail "advice that changes nothing: $err"; fi

# Human-readable units in the plan; a checkpoint's plan without running it; --explain grouped.
out=$("$bin" plan --tokens 1000000 --quiet)
grep -qE "estimated peak [0-9.]+ GiB" <<<"$out" && grep -qE "estimated time [0-9]+ h [0-9]+ min" <<<"$out" \
  || fail "plan's units: $out"
out=$("$bin" plan --checkpoint "$tmp/wan.safetensors" --frames 5 --height 64 --width 64 --explain --quiet)
grep -qF "wan2.1-tiny" <<<"$out" && grep -qE "^  blocks 0–[0-9]+ \([0-9]+ blocks, same plan\)" <<<"$out" \
  && grep -qE "^  [0-9]+ linears in blocks 0–[0-9]+ \([0-9]+ per block\): dense" <<<"$out" \
  || fail "plan --checkpoint --explain: $out"
full=$("$bin" plan --checkpoint "$tmp/wan.safetensors" --frames 5 --height 64 --width 64 --explain=full --quiet | wc -l)
grouped=$(wc -l <<<"$out")
[ "$grouped" -lt "$full" ] || fail "--explain ($grouped lines) not shorter than --explain=full ($full)"

# A non-finite output warns on stderr and is counted in --json: one weight set to NaN in the
# file's bytes (safetensors: an 8-byte header length, the JSON header, then the data).
python3 - "$tmp/wan.safetensors" "$tmp/nan.safetensors" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
begin, end = header["head.head.weight"]["data_offsets"]
assert header["head.head.weight"]["dtype"] == "F32"
data = bytearray(raw[8 + n:])
data[begin:end] = struct.pack("<f", float("nan")) * ((end - begin) // 4)
open(sys.argv[2], "wb").write(raw[:8 + n] + bytes(data))
PY
err=$("$bin" run --checkpoint "$tmp/nan.safetensors" --tokens 64 --planned-only --json --quiet 2>&1 >"$tmp/nan.json") \
  || fail "run with a NaN weight failed: $err"
grep -qF "streamplan: warning: output has" <<<"$err" || fail "no warning for a non-finite output: $err"
python3 -c 'import json, sys; assert json.load(open(sys.argv[1]))["nonfinite"] > 0' "$tmp/nan.json" \
  || fail "--json does not count the non-finite values"
echo "cli_user_test: ok"
