"""Tiny diffusers pipelines for the package's tests: random-weight Wan 2.1 and Flux.1
transformers (the shapes and the randomization of tests/reference/make_reference.py), tiny VAE
configs, the pipelines' real schedulers, and no tokenizer or text encoder: the prompts come as
embeddings. Everything runs in fp32 on the CPU.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

import pytest
import torch

os.environ["DIFFUSERS_ATTN_BACKEND"] = "native"
os.environ.setdefault("HF_HUB_OFFLINE", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))

import make_reference  # noqa: E402  (tests/reference: the configs and the randomization)

STEPS = 3
WAN_FRAMES, WAN_HEIGHT, WAN_WIDTH = 9, 64, 96  # latents [16, 3, 8, 12]: 72 tokens
FLUX_HEIGHT, FLUX_WIDTH = 128, 96  # packed latents 8 x 6 = 48 tokens
TEXT_LEN = 7


def rel_l2(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.double(), ref.double()
    return float((x - ref).norm() / ref.norm())


def _wan_vae() -> Any:
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                            temperal_downsample=[False, True, True])


def _flux_vae() -> Any:
    from diffusers import AutoencoderKL

    # Four levels: the pipeline's VAE scale factor 8, as Flux's own; latent channels 16/4 packed.
    return AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4,
                         down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                         block_out_channels=(4, 4, 4, 4), layers_per_block=1, norm_num_groups=2)


def make_wan_transformer(seed: int = 0) -> Any:
    from diffusers import WanTransformer3DModel

    transformer = WanTransformer3DModel(**make_reference.WAN_CONFIG)
    make_reference.randomize(transformer, torch.Generator().manual_seed(seed))
    return transformer.eval()


def make_flux_transformer(variant: str = "dev", seed: int = 0) -> Any:
    from diffusers import FluxTransformer2DModel

    transformer = FluxTransformer2DModel(**make_reference.flux_config(variant))
    make_reference.randomize(transformer, torch.Generator().manual_seed(seed))
    return transformer.eval()


def make_wan_pipeline(seed: int = 0) -> Any:
    from diffusers import UniPCMultistepScheduler, WanPipeline

    transformer = make_wan_transformer(seed)
    # Wan 2.1's own scheduler configuration (flow prediction, shift 3).
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                        num_train_timesteps=1000, flow_shift=3.0)
    pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=_wan_vae(), scheduler=scheduler,
                       transformer=transformer)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def make_flux_pipeline(variant: str = "dev", seed: int = 0) -> Any:
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline

    transformer = make_flux_transformer(variant, seed)
    # Flux.1's own scheduler configuration (resolution-dependent shift).
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True,
                                                base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
                                                max_image_seq_len=4096)
    pipe = FluxPipeline(scheduler=scheduler, vae=_flux_vae(), text_encoder=None, tokenizer=None,
                        text_encoder_2=None, tokenizer_2=None, transformer=transformer)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def run_wan(pipe: Any, videos: int = 1, guidance: float = 5.0, **kwargs: Any) -> torch.Tensor:
    """The pipeline's latents after STEPS steps, CFG on when guidance > 1."""
    gen = torch.Generator().manual_seed(1)
    dim = pipe.transformer.config.text_dim
    prompt = torch.randn((1, TEXT_LEN, dim), generator=gen)
    negative = torch.randn((1, TEXT_LEN, dim), generator=gen)
    out = pipe(prompt_embeds=prompt, negative_prompt_embeds=negative, height=WAN_HEIGHT, width=WAN_WIDTH,
               num_frames=WAN_FRAMES, num_inference_steps=STEPS, guidance_scale=guidance,
               num_videos_per_prompt=videos, generator=torch.Generator().manual_seed(2), output_type="latent",
               **kwargs)
    return out.frames


def run_flux(pipe: Any, images: int = 1, true_cfg: float = 2.0, **kwargs: Any) -> torch.Tensor:
    """The pipeline's latents after STEPS steps, true CFG on when true_cfg > 1."""
    gen = torch.Generator().manual_seed(1)
    cfg = pipe.transformer.config
    prompt = torch.randn((1, TEXT_LEN, cfg.joint_attention_dim), generator=gen)
    pooled = torch.randn((1, cfg.pooled_projection_dim), generator=gen)
    negative = torch.randn((1, TEXT_LEN, cfg.joint_attention_dim), generator=gen)
    negative_pooled = torch.randn((1, cfg.pooled_projection_dim), generator=gen)
    kwargs = {"height": FLUX_HEIGHT, "width": FLUX_WIDTH, **kwargs}
    out = pipe(prompt_embeds=prompt, pooled_prompt_embeds=pooled, negative_prompt_embeds=negative,
               negative_pooled_prompt_embeds=negative_pooled, true_cfg_scale=true_cfg, guidance_scale=3.5,
               num_inference_steps=STEPS, num_images_per_prompt=images,
               generator=torch.Generator().manual_seed(2), output_type="latent", **kwargs)
    return out.images


def wan_call(module: Any, batch: int = 1) -> dict[str, Any]:
    """Arguments of one direct call of a Wan transformer, as WanPipeline passes them."""
    gen = torch.Generator().manual_seed(3)
    c = module.config
    return {
        "hidden_states": torch.randn((batch, c.in_channels, 3, 8, 12), generator=gen),
        "timestep": torch.full((batch,), 730.0),
        "encoder_hidden_states": torch.randn((batch, TEXT_LEN, c.text_dim), generator=gen),
        "return_dict": False,
    }


def flux_call(module: Any, batch: int = 1) -> dict[str, Any]:
    """Arguments of one direct call of a Flux transformer, as FluxPipeline passes them."""
    gen = torch.Generator().manual_seed(3)
    c = module.config
    rows, cols = 6, 8
    img_ids = torch.zeros(rows, cols, 3)
    img_ids[..., 1] = torch.arange(rows)[:, None]
    img_ids[..., 2] = torch.arange(cols)[None, :]
    call = {
        "hidden_states": torch.randn((batch, rows * cols, c.in_channels), generator=gen),
        "encoder_hidden_states": torch.randn((batch, TEXT_LEN, c.joint_attention_dim), generator=gen),
        "pooled_projections": torch.randn((batch, c.pooled_projection_dim), generator=gen),
        "timestep": torch.full((batch,), 0.73),
        "img_ids": img_ids.reshape(-1, 3),
        "txt_ids": torch.zeros(TEXT_LEN, 3),
        "return_dict": False,
    }
    if c.guidance_embeds:
        call["guidance"] = torch.full((batch,), 3.5)
    return call


@pytest.fixture(scope="module")
def wan_pipe() -> Any:
    return make_wan_pipeline()


@pytest.fixture(scope="module")
def flux_pipe() -> Any:
    return make_flux_pipeline("dev")


@pytest.fixture
def wan_module() -> Any:
    return make_wan_transformer()


@pytest.fixture
def flux_module() -> Any:
    return make_flux_transformer("dev")


@pytest.fixture(autouse=True)
def _detached(request: pytest.FixtureRequest) -> Any:
    """Every test leaves the shared pipelines' transformers as it found them."""
    yield
    import streamplan

    for name in ("wan_pipe", "flux_pipe"):
        if name in request.fixturenames:
            module = request.getfixturevalue(name).transformer
            if streamplan.handle_of(module) is not None:
                streamplan.remove(module)


Runner = Callable[..., torch.Tensor]
