"""The int8 and sparse attention consumers from Python: the KV budget options and the errors
where they cannot run (a CPU module). Their numerics are the GPU tests of tests/attention_test.cpp."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import wan_call

import streamplan


def test_consumers_are_listed() -> None:
    assert {"int8", "sparse"} <= set(streamplan.consumers())


def test_kv_budget_at_follows_the_schedule() -> None:
    assert streamplan.kv_budget_at(0, 10, 0.3, early_steps=2, early_kv=0.5) == 0.5
    assert streamplan.kv_budget_at(5, 10, 0.3, early_steps=2, early_kv=0.5, late_steps=2, late_kv=0.7) == 0.3
    assert streamplan.kv_budget_at(9, 10, 0.3, late_steps=2, late_kv=0.7) == 0.7
    # errors name the Python arguments, not the command's options
    with pytest.raises(ValueError, match=r"^budget: a fraction in \(0, 1\], got 1\.5"):
        streamplan.kv_budget_at(0, 10, 1.5)
    with pytest.raises(ValueError, match=r"^step=10 .*steps=10") as e:
        streamplan.kv_budget_at(10, 10, 0.3)
    assert "--" not in str(e.value)


def test_kv_budget_is_checked_and_only_for_sparse(wan_module: Any) -> None:
    with pytest.raises(ValueError, match="kv_budget.*1.5"):
        streamplan.apply(wan_module, consumer="sparse", kv_budget=1.5)
    assert streamplan.handle_of(wan_module) is None and "forward" not in wan_module.__dict__
    handle = streamplan.apply(wan_module, consumer="sdpa")
    with pytest.raises(ValueError, match="runs consumer 'sdpa', not 'sparse'"):
        handle.set_kv_budget(0.3)
    handle.remove()


@pytest.mark.parametrize("consumer", ["int8", "sparse"])
def test_on_the_cpu_the_choice_is_an_error_not_a_fallback(wan_module: Any, consumer: str) -> None:
    handle = streamplan.apply(wan_module, consumer=consumer, kv_budget=0.5 if consumer == "sparse" else None)
    with torch.no_grad(), pytest.raises(ValueError, match=f"consumer '{consumer}'.*needs a CUDA device"):
        wan_module(**wan_call(wan_module))
    assert handle.fallbacks == []
    handle.remove()


def test_each_kv_budget_has_its_plan(wan_module: Any) -> None:
    """The KV budget is a plan input: a budget gets a plan of its own, cached beside the others
    (made before the CPU run refuses the consumer), and a budget used before finds its plan."""
    handle = streamplan.apply(wan_module, consumer="sparse", kv_budget=0.5)
    for budget in (0.5, 0.25, 0.5):
        handle.set_kv_budget(budget)
        with torch.no_grad(), pytest.raises(ValueError, match="needs a CUDA device"):
            wan_module(**wan_call(wan_module))
    plans = handle.plans
    assert [p["key"].endswith(f"kv budget {b})") for p, b in zip(plans, ("0.5", "0.25"))] == [True, True], plans
    assert len(plans) == 2
    handle.remove()


# --- scripts/attn_error_model.py: the emulated error of 8-bit schemes ---------------------------

def _error_model():
    import importlib.util
    path = Path(__file__).resolve().parents[2] / "scripts" / "attn_error_model.py"
    spec = importlib.util.spec_from_file_location("attn_error_model", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_error_model_separates_the_schemes_it_compares(tmp_path):
    out = tmp_path / "rows.json"
    assert _error_model().main(["--rows", "512", "--heads", "1", "--distribution", "gaussian,outlier-k,video-local",
                                "--json", str(out)]) == 0
    got = {(r["distribution"], r["scheme"]): r["rel_l2"] for r in json.loads(out.read_text())["results"]}
    # The int8 consumer's arithmetic: about 1.3e-2 on Gaussian inputs, several times that with K outliers.
    assert 5e-3 < got[("gaussian", "int8 tile")] < 2e-2
    assert got[("outlier-k", "int8 tile")] > 4e-2
    # Balancing K's channels against Q's is exact in real arithmetic and cuts the outlier error.
    assert got[("outlier-k", "int8 tile, K channels balanced")] < 0.5 * got[("outlier-k", "int8 tile")]
    # e4m3 P and V cost a few percent wherever V is zero-mean noise.
    for d in ("gaussian", "video-local"):
        assert got[(d, "int8 tile + FP8 P·V")] > 2.5e-2 > got[(d, "int8 tile")]
        # u8 P scaled per KV tile against s8 V (mean subtracted) stays within 2e-2 there.
        assert got[(d, "int8 tile + INT8 P·V, P per KV tile")] < 2e-2
        assert got[(d, "int8 tile + INT8 P·V, P per KV tile")] < got[(d, "int8 tile + INT8 P·V")]
    # The predicted logit noise sets apart the inputs where int8 Q·K^T misses 2e-2.
    noise = json.loads(out.read_text())["logit_noise"]
    assert max(noise["gaussian"]) < 3e-2 < 5e-2 < min(noise["outlier-k"])
    assert max(noise["video-local"]) < 3e-2


def test_the_error_model_names_bad_arguments(capsys):
    with pytest.raises(SystemExit) as e:
        _error_model().main(["--rows", "100"])
    assert e.value.code == 2
    assert "--rows: a positive multiple of 128, got 100" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _error_model().main(["--distribution", "uniform"])
    assert "--distribution: unknown 'uniform'" in capsys.readouterr().err
