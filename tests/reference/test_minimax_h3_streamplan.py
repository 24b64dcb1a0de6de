"""streamplan's MiniMax H3 forward (`streamplan run`, planned and naive schedules) against the
plain-torch reference (minimax_h3.py) on tiny random checkpoints in the real layout, fp32 on the
CPU: video and audio within rel L2 1e-4.

The command is build/streamplan, or $STREAMPLAN_BIN.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import minimax_h3 as ref  # noqa: E402

BIN = os.environ.get("STREAMPLAN_BIN", os.path.join(HERE, "..", "..", "build", "streamplan"))
TOLERANCE = 1e-4

VARIANTS = {
    "plain": (ref.TINY, "", None),
    "curve": (replace(ref.TINY, curve_grid=11, time_dim=8), "model.diffusion_model.", None),
    "gate_compress": (replace(ref.TINY, gate_compress=True), "diffusion_model.", None),
    # Text tokens carrying all three modality tags in runs: their own modulation rows.
    "mixed_tags": (ref.TINY, "", torch.tensor([1, 1, 0, 0, 0, 1, 2, 2, 1])),
}


def run_streamplan(tmp_path, sd, inputs, extra=()):
    assert os.path.exists(BIN), f"{BIN} is not built (scripts/setup.sh builds it; or set STREAMPLAN_BIN)"
    ck, inp, out = tmp_path / "h3.safetensors", tmp_path / "inputs.safetensors", tmp_path / "out.safetensors"
    save_file({k: v.contiguous() for k, v in sd.items()}, str(ck))
    save_file({k: v.contiguous() for k, v in inputs.items()}, str(inp))
    cmd = [BIN, "run", "--checkpoint", str(ck), "--inputs", str(inp), "--output", str(out), "--device", "cpu",
           "--dtype", "fp32", "--quiet", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return load_file(str(out)), proc


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_forward_matches_reference(tmp_path, variant):
    cfg, prefix, tags = VARIANTS[variant]
    sd = ref.make_state_dict(cfg, seed=3, prefix=prefix)
    x = ref.random_inputs(cfg, text_len=9, latent_t=7, lat_h=6, lat_w=8, audio_t=5, seed=4)
    sigma = 0.63
    inputs = {"video": x["video"], "audio": x["audio"], "text": x["text"], "sigma": torch.tensor([sigma])}
    if tags is not None:
        inputs["text_tags"] = tags
    want_v, want_a = ref.h3_forward(ref.to_dtype(sd, torch.float64), x["video"].double(), x["audio"].double(),
                                    x["text"].double(), sigma, text_tags=tags)
    # A chunk that divides nothing: the planned schedule streams slabs across segment edges.
    got, _ = run_streamplan(tmp_path, sd, inputs, ["--chunk", "23"])
    for schedule in ("output", "naive_output"):
        v, a = got[schedule + "_video"], got[schedule + "_audio"]
        assert v.shape == want_v.shape and a.shape == want_a.shape, (v.shape, a.shape)
        assert ref.rel_l2(v, want_v) < TOLERANCE, (schedule, "video", ref.rel_l2(v, want_v))
        assert ref.rel_l2(a, want_a) < TOLERANCE, (schedule, "audio", ref.rel_l2(a, want_a))
    assert torch.equal(got["output"], got["output_video"])


def test_pdd_head_bank_is_a_clear_error(tmp_path):
    cfg = replace(ref.TINY, pdd_heads=3)
    sd = ref.make_state_dict(cfg, seed=3)
    x = ref.random_inputs(cfg, seed=4)
    inputs = {"video": x["video"], "audio": x["audio"], "text": x["text"], "sigma": torch.tensor([0.5])}
    ck, inp = tmp_path / "h3.safetensors", tmp_path / "inputs.safetensors"
    save_file(sd, str(ck))
    save_file(inputs, str(inp))
    proc = subprocess.run([BIN, "run", "--checkpoint", str(ck), "--inputs", str(inp), "--device", "cpu", "--quiet"],
                          capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    assert "PDD head bank" in proc.stderr and "sigma schedule" in proc.stderr, proc.stderr


def test_bad_inputs_name_the_field(tmp_path):
    sd = ref.make_state_dict(ref.TINY, seed=3)
    x = ref.random_inputs(ref.TINY, seed=4)
    ck, inp = tmp_path / "h3.safetensors", tmp_path / "inputs.safetensors"
    save_file(sd, str(ck))
    bad = {"video": x["video"], "audio": x["audio"], "text": x["text"], "sigma": torch.tensor([0.5]),
           "text_tags": torch.tensor([1, 5, 1, 1, 1, 1, 1, 1, 1])}
    save_file(bad, str(inp))
    proc = subprocess.run([BIN, "run", "--checkpoint", str(ck), "--inputs", str(inp), "--device", "cpu", "--quiet"],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "text_tags[1] is 5" in proc.stderr, proc.stderr
