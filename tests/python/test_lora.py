"""LoRA given to streamplan (streamplan.apply(module, lora=...)) against diffusers' own
load_lora_weights (PEFT) on the same files: tiny Wan 2.1 and Flux.1 transformers in fp32, the
trainer (ComfyUI-layout), kohya/musubi and diffusers namings, several LoRAs with strengths.
Also: keys that match no weight are reported, and a LoRA of another family is a clear error."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from conftest import flux_call, make_flux_pipeline, make_flux_transformer, make_wan_pipeline, make_wan_transformer
from conftest import rel_l2, wan_call

import streamplan

import peft  # noqa: E402,F401  (pinned in requirements.txt: the reference loads the LoRAs through it)

TOL = 1e-4

# Wan block linears: diffusers name -> the original (ComfyUI / trainer) name.
WAN_BLOCK = {
    "attn1.to_q": "self_attn.q", "attn1.to_k": "self_attn.k", "attn1.to_v": "self_attn.v",
    "attn1.to_out.0": "self_attn.o", "attn2.to_q": "cross_attn.q", "attn2.to_k": "cross_attn.k",
    "attn2.to_v": "cross_attn.v", "attn2.to_out.0": "cross_attn.o", "ffn.net.0.proj": "ffn.0", "ffn.net.2": "ffn.2",
}


def _ab(module: torch.nn.Module, name: str, rank: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    lin = module.get_submodule(name)
    a = torch.randn(rank, lin.in_features, generator=g) / lin.in_features ** 0.5
    b = torch.randn(lin.out_features, rank, generator=g) * 0.3
    return a, b


def wan_lora(module: torch.nn.Module, naming: str, rank: int, seed: int) -> dict[str, torch.Tensor]:
    """Every block linear of a Wan transformer: 'trainer' (diffusion_model.blocks.N.self_attn.q
    lora_A/B with alpha), or 'musubi' (kohya: lora_unet_blocks_N_self_attn_q lora_down/up, alpha)."""
    g = torch.Generator().manual_seed(seed)
    sd: dict[str, torch.Tensor] = {}
    for i in range(len(module.blocks)):
        for diff, orig in WAN_BLOCK.items():
            a, b = _ab(module, f"blocks.{i}.{diff}", rank, g)
            alpha = torch.tensor(float(rank) * 1.5)
            if naming == "trainer":
                key = f"diffusion_model.blocks.{i}.{orig}"
                sd |= {f"{key}.lora_A.weight": a, f"{key}.lora_B.weight": b, f"{key}.alpha": alpha}
            else:
                key = f"lora_unet_blocks_{i}_{orig.replace('.', '_')}"
                sd |= {f"{key}.lora_down.weight": a, f"{key}.lora_up.weight": b, f"{key}.alpha": alpha}
    return sd


def flux_diffusers_lora(module: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """diffusers naming: split q/k/v (rows of the fused canonical qkv / linear1), no alpha."""
    g = torch.Generator().manual_seed(seed)
    names = ["transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.to_v", "transformer_blocks.1.attn.add_k_proj",
             "transformer_blocks.1.ff.net.2", "transformer_blocks.0.attn.to_out.0",
             "single_transformer_blocks.0.attn.to_k", "single_transformer_blocks.1.proj_mlp",
             "single_transformer_blocks.1.proj_out"]
    sd: dict[str, torch.Tensor] = {}
    for n in names:
        a, b = _ab(module, n, 3, g)
        sd |= {f"transformer.{n}.lora_A.weight": a, f"transformer.{n}.lora_B.weight": b}
    return sd


def flux_kohya_lora(module: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """kohya (sd-scripts) naming on the original layout: the fused qkv, linear2, alpha. (diffusers
    converts a kohya linear1 with Flux.1's real widths only, so the tiny model's has none.)"""
    g = torch.Generator().manual_seed(seed)
    dim = module.config.num_attention_heads * module.config.attention_head_dim
    mlp = module.single_transformer_blocks[0].proj_mlp.out_features
    shapes = {"double_blocks_0_img_attn_qkv": (3 * dim, dim), "double_blocks_1_txt_attn_proj": (dim, dim),
              "double_blocks_0_img_mlp_0": (mlp, dim), "single_blocks_1_linear2": (dim, dim + mlp)}
    sd: dict[str, torch.Tensor] = {}
    for key, (out, inp) in shapes.items():
        rank = 4
        sd[f"lora_unet_{key}.lora_down.weight"] = torch.randn(rank, inp, generator=g) / inp ** 0.5
        sd[f"lora_unet_{key}.lora_up.weight"] = torch.randn(out, rank, generator=g) * 0.3
        sd[f"lora_unet_{key}.alpha"] = torch.tensor(2.0)
    return sd


def reference(pipe: Any, loras: list[tuple[dict[str, torch.Tensor], float]], call: dict[str, Any]) -> torch.Tensor:
    """The pipeline's transformer with the LoRAs loaded by diffusers (load_lora_weights, PEFT)."""
    names = []
    for i, (sd, _) in enumerate(loras):
        pipe.load_lora_weights({k: v.clone() for k, v in sd.items()}, adapter_name=f"l{i}")
        names.append(f"l{i}")
    pipe.set_adapters(names, adapter_weights=[s for _, s in loras])
    with torch.no_grad():
        return pipe.transformer(**call)[0]


def planned(module: torch.nn.Module, loras: list[tuple[dict[str, torch.Tensor], float]],
            call: dict[str, Any]) -> tuple[torch.Tensor, Any]:
    handle = streamplan.apply(module, lora=loras, token_chunk=13)
    with torch.no_grad():
        out = module(**call)[0]
    assert handle.planned_calls == 1, handle.fallbacks
    return out, handle


@pytest.mark.parametrize("naming", ["trainer", "musubi"])
def test_wan_lora_matches_diffusers_load_lora_weights(naming: str) -> None:
    module = make_wan_transformer()
    loras = [(wan_lora(module, naming, 4, 7), 0.8)]
    call = wan_call(module)
    with torch.no_grad():
        base = module(**call)[0]
    ref = reference(make_wan_pipeline(), loras, call)
    out, handle = planned(module, loras, call)
    assert rel_l2(ref, base) > 1e-2  # the LoRA changes the output
    assert rel_l2(out, ref) <= TOL
    assert handle.lora["adapters"] == 10 * len(module.blocks)
    assert handle.lora["unmatched"] == [] and handle.lora["unapplied"] == []
    assert f"{10 * len(module.blocks)} LoRA adapters" in repr(handle)


def test_flux_two_loras_with_strengths_match_diffusers() -> None:
    module = make_flux_transformer("dev")
    loras = [(flux_diffusers_lora(module, 3), 0.7), (flux_kohya_lora(module, 4), 1.3)]
    call = flux_call(module)
    with torch.no_grad():
        base = module(**call)[0]
    ref = reference(make_flux_pipeline("dev"), loras, call)
    out, handle = planned(module, loras, call)
    assert rel_l2(ref, base) > 1e-2
    assert rel_l2(out, ref) <= TOL
    assert handle.lora["adapters"] == 8 + 4


def test_lora_from_a_file_and_unmatched_keys_are_reported(tmp_path: Any) -> None:
    from safetensors.torch import save_file

    module = make_wan_transformer()
    sd = wan_lora(module, "trainer", 2, 9)
    sd["lora_te_text_model_encoder_layers_0_mlp_fc1.lora_down.weight"] = torch.randn(2, 8)
    sd["diffusion_model.blocks.0.self_attn.q.diff_b"] = torch.randn(8)
    path = tmp_path / "wan.safetensors"
    save_file(sd, str(path))
    with pytest.warns(UserWarning, match="2 LoRA key\\(s\\) match no weight"):
        handle = streamplan.apply(module, lora=[(str(path), 0.5)])
    assert sorted(handle.lora["unmatched"]) == sorted(
        [f"{path}: lora_te_text_model_encoder_layers_0_mlp_fc1.lora_down.weight",
         f"{path}: diffusion_model.blocks.0.self_attn.q.diff_b"])


def test_lora_of_another_family_is_a_clear_error() -> None:
    flux = make_flux_transformer("dev")
    wan = make_wan_transformer()
    with pytest.raises(ValueError, match="names a weight of this wan2.1 model"):
        streamplan.apply(wan, lora=[flux_diffusers_lora(flux, 1)])
    assert streamplan.handle_of(wan) is None


def test_mismatched_rank_names_the_tensors_and_shapes() -> None:
    module = make_wan_transformer()
    sd = wan_lora(module, "trainer", 4, 2)
    sd["diffusion_model.blocks.1.ffn.2.lora_B.weight"] = torch.randn(64, 3)
    with pytest.raises(ValueError, match=r"blocks\.1\.ffn\.2\.lora_A\.weight' \[4, 96\].*\[64, 3\]"):
        streamplan.apply(module, lora=[sd])


def test_lora_argument_types_are_checked() -> None:
    module = make_wan_transformer()
    with pytest.raises(TypeError, match="strength"):
        streamplan.apply(module, lora=[({}, "strong")])
    with pytest.raises(TypeError, match="safetensors path or a state dict"):
        streamplan.apply(module, lora=[42])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        handle = streamplan.apply(module, lora=None)
    assert handle.lora["adapters"] == 0
