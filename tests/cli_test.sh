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
assert r["error"]["rel_l2"] <= 1e-5, r["error"]
assert r["planned"]["peak_bytes"] < r["naive"]["peak_bytes"]
assert abs(r["planned"]["estimated_peak_bytes"] - r["planned"]["peak_bytes"]) <= 0.05 * r["planned"]["peak_bytes"]
PY

out=$("$bin" plan --explain --consumer whole --patch mlp-hidden-rownorm --format int8-rowwise --chunk 256)
for s in "rejected by consumer 'whole': accepts bounded Q against global K/V [consumer.bounded_q] — required yes, actual undeclared" \
         "rejected by patch 'mlp-hidden-rownorm' on MLP hidden: runs on a feature slice [patch.feature_local] — required yes, actual no" \
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
"$bin" plan --json --patch attn-out-renorm --chunk 256 | python3 -c '
import json, sys
p = json.load(sys.stdin)["plan"]
t = {d["transformation"]: d for d in p["blocks"][0]["sublayers"][0]["transformations"]}
assert not t["streamed output projection"]["chosen"]
assert "attn-out-renorm" in t["streamed output projection"]["rejections"][0]["component"]
assert t["global K/V + streamed Q"]["chosen"]' || fail "plan --json rejection"

# Bad input: clear errors, nonzero status.
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
# Checkpoints: a tiny H3 written and run with outputs; malformed and unrecognized files named.
corpus="$(dirname "$0")/../fuzz/corpus"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bin" make-checkpoint --family h3 --tiny --layers 1 --out "$tmp/h3.safetensors" >/dev/null
"$bin" run --device cpu --checkpoint "$tmp/h3.safetensors" --frames 2 --height 64 --width 96 --text-tokens 5 --audio-tokens 3 \
  --output "$tmp/out.safetensors" --json | python3 -c '
import json, sys
r = json.load(sys.stdin)
assert r["error"]["rel_l2"] <= 1e-5, r["error"]' || fail "run on a tiny h3 checkpoint"
[ -s "$tmp/out.safetensors" ] || fail "run --output wrote nothing"
if err=$("$bin" run --checkpoint "$corpus/bad_overlap.safetensors" --tokens 10 2>&1); then fail "malformed checkpoint accepted"; fi
grep -q "overlaps tensor 'a'" <<<"$err" || fail "unexpected error: $err"
if err=$("$bin" run --checkpoint "$corpus/valid_small.safetensors" --tokens 10 2>&1); then fail "unknown checkpoint accepted"; fi
grep -q "unrecognized checkpoint" <<<"$err" || fail "unexpected error: $err"
if err=$("$bin" run --device cpu --checkpoint "$tmp/h3.safetensors" --frames 2 --height 60 --width 96 2>&1); then fail "bad geometry accepted"; fi
grep -q "multiples of 32, got 2x60x96" <<<"$err" || fail "unexpected error: $err"
echo "cli_test: ok"
