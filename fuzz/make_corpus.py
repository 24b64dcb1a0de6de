#!/usr/bin/env python3
"""Writes the seed corpus for safetensors_fuzz into fuzz/corpus/ (stdlib only, deterministic).

Usage: python3 fuzz/make_corpus.py [OUT_DIR]
"""
import json
import os
import struct
import sys


def image(header, data=b"", pad=True, raw_len=None):
    """8-byte LE length + header + data. `header` may be a dict (dumped) or raw bytes."""
    h = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h) if raw_len is None else raw_len) + h + data


def t(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


SEEDS = {
    # --- valid ---
    "valid_small": image(
        {"__metadata__": {"format": "pt"},
         "w.bf16": t("BF16", [2, 3], 0, 12), "w.f8": t("F8_E4M3", [4], 12, 16),
         "w.i8": t("I8", [2, 2], 16, 20), "w.f32": t("F32", [1], 20, 24)},
        bytes(range(24))),
    "valid_all_dtypes": image(
        {"a": t("F64", [1], 0, 8), "b": t("F32", [1], 8, 12), "c": t("F16", [1], 12, 14),
         "d": t("BF16", [1], 14, 16), "e": t("F8_E4M3", [1], 16, 17), "f": t("F8_E5M2", [1], 17, 18),
         "g": t("I64", [1], 18, 26), "h": t("I32", [1], 26, 30), "i": t("I16", [1], 30, 32),
         "j": t("I8", [1], 32, 33), "k": t("U8", [1], 33, 34), "l": t("BOOL", [1], 34, 35)},
        bytes(35)),
    "valid_empty_header": image({}),
    "valid_zero_size_and_scalar": image(
        {"z": t("F32", [0, 5], 0, 0), "s": t("I64", [], 0, 8)}, bytes(8)),
    "valid_gap_and_trailing": image({"a": t("U8", [2], 4, 6)}, bytes(10)),
    # --- broken ---
    "bad_too_short": b"\x10\x00\x00",
    "bad_header_len_past_eof": image({"a": t("U8", [1], 0, 1)}, b"\x00", raw_len=4096),
    "bad_header_len_absurd": struct.pack("<Q", 1 << 40) + b"{}",
    "bad_json_truncated": image(b'{"a":{"dtype":"U8","shape":[1],'),
    "bad_not_object": image(b"[1,2,3]"),
    "bad_utf8": image(b'{"\xff\xfe":{}}'),
    "bad_duplicate_key": image(b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                               b'"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x01"),
    "bad_extra_key": image({"a": dict(t("U8", [1], 0, 1), extra=1)}, b"\x01"),
    "bad_unknown_dtype": image({"a": t("F128", [1], 0, 16)}, bytes(16)),
    "bad_negative_dim": image({"a": t("F32", [2, -3], 0, 0)}),
    "bad_numel_overflow": image({"a": t("F32", [1 << 32, 1 << 32], 0, 0)}),
    "bad_shape_mismatch": image({"a": t("BF16", [3, 3], 0, 16)}, bytes(16)),
    "bad_offsets_reversed": image({"a": t("U8", [0], 8, 4)}, bytes(8)),
    "bad_out_of_range": image({"a": t("U8", [8], 4, 12)}, bytes(8)),
    "bad_overlap": image({"a": t("U8", [8], 0, 8), "b": t("U8", [8], 4, 12)}, bytes(16)),
    "bad_metadata": image({"__metadata__": {"format": 1}}),
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
    os.makedirs(out, exist_ok=True)
    for name, blob in sorted(SEEDS.items()):
        with open(os.path.join(out, name + ".safetensors"), "wb") as f:
            f.write(blob)
    print(f"wrote {len(SEEDS)} seeds to {out}")


if __name__ == "__main__":
    main()
