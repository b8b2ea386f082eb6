"""The FLUX.1 and Qwen-Image transformers split pipeline-wise over the ranks of an
mx.distributed group.

Every rank runs the whole pipeline (text encoders, scheduler, VAE) on the same seed, so all
of them hold the same inputs; only the transformer's blocks (FLUX.1: joint blocks, then single
blocks, counted as one list; Qwen-Image: its joint blocks) are divided. Rank r receives the hidden states from rank r-1, runs its
blocks and sends them on; the last rank projects the output, and a sum over the group gives
every rank the same noise prediction, so their denoising loops stay in step. Adding the other
ranks' zeros is exact: the image equals one rank's.

Imported only in runner subprocesses and benchmarks (it imports MLX and mflux).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx import nn


def even_blocks(n_blocks: int, rank: int, size: int) -> tuple[int, int]:
    """Rank `rank`'s share `[start, end)` of `n_blocks`, earlier ranks taking the remainder."""
    base, extra = divmod(n_blocks, size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


class SplitTransformer(nn.Module):
    """mflux's `Transformer` holding only blocks `[start, end)`, joined to the other ranks."""

    def __init__(self, inner: Any, group: mx.distributed.Group, start: int, end: int) -> None:
        super().__init__()
        n_joint = len(inner.transformer_blocks)
        n_single = len(inner.single_transformer_blocks)
        if not 0 <= start <= end <= n_joint + n_single:
            raise ValueError(f"blocks [{start}, {end}) are not within {n_joint + n_single}")
        # The blocks of other ranks are let go (their memory is what the split saves).
        inner.transformer_blocks = inner.transformer_blocks[start:end]
        inner.single_transformer_blocks = inner.single_transformer_blocks[
            max(0, start - n_joint) : max(0, end - n_joint)
        ]
        self.inner = inner
        self.group = group
        self.rank = group.rank()
        self.size = group.size()

    def __call__(
        self,
        t: int,
        config: Any,
        hidden_states: mx.array,
        prompt_embeds: mx.array,
        pooled_prompt_embeds: mx.array,
        controlnet_block_samples: list[mx.array] | None = None,
        controlnet_single_block_samples: list[mx.array] | None = None,
        kontext_image_ids: mx.array | None = None,
    ) -> mx.array:
        from mflux.models.flux.model.flux_transformer.transformer import Transformer

        inner = self.inner
        hidden = inner.x_embedder(hidden_states)
        encoder = inner.context_embedder(prompt_embeds)
        text = Transformer.compute_text_embeddings(
            t, pooled_prompt_embeds, inner.time_text_embed, config
        )
        rotary = Transformer.compute_rotary_embeddings(
            prompt_embeds, inner.pos_embed, config, kontext_image_ids
        )
        n_text = encoder.shape[1]
        # Between ranks travels [text tokens, image tokens], as the single blocks take them.
        joined = mx.concatenate([encoder, hidden], axis=1)
        if self.rank > 0:
            joined = mx.distributed.recv_like(joined, self.rank - 1, group=self.group)
            encoder, hidden = joined[:, :n_text], joined[:, n_text:]
        for block in inner.transformer_blocks:
            encoder, hidden = block(
                hidden_states=hidden,
                encoder_hidden_states=encoder,
                text_embeddings=text,
                rotary_embeddings=rotary,
            )
        joined = mx.concatenate([encoder, hidden], axis=1)
        for block in inner.single_transformer_blocks:
            joined = block(hidden_states=joined, text_embeddings=text, rotary_embeddings=rotary)
        if self.rank < self.size - 1:
            mx.eval(mx.distributed.send(joined, self.rank + 1, group=self.group))
            out_dims = inner.proj_out.weight.shape[0]
            noise = mx.zeros((joined.shape[0], joined.shape[1] - n_text, out_dims), joined.dtype)
        else:
            noise = inner.proj_out(inner.norm_out(joined[:, n_text:], text))
        return mx.distributed.all_sum(noise, group=self.group)


class SplitQwenTransformer(nn.Module):
    """mflux's `QwenTransformer` holding only blocks `[start, end)`, joined to the other ranks.

    Its embeddings, masks and rotary tables are mflux's own (`QwenTransformer`'s static
    helpers); between ranks travel the text and image streams, [text tokens, image tokens]."""

    def __init__(self, inner: Any, group: mx.distributed.Group, start: int, end: int) -> None:
        super().__init__()
        n_blocks = len(inner.transformer_blocks)
        if not 0 <= start <= end <= n_blocks:
            raise ValueError(f"blocks [{start}, {end}) are not within {n_blocks}")
        inner.transformer_blocks = inner.transformer_blocks[start:end]
        self.inner = inner
        self.start = start
        self.group = group
        self.rank = group.rank()
        self.size = group.size()

    def __call__(
        self,
        t: int,
        config: Any,
        hidden_states: mx.array,
        encoder_hidden_states: mx.array,
        encoder_hidden_states_mask: mx.array,
        qwen_image_ids: mx.array | None = None,
        cond_image_grid: Any = None,
    ) -> mx.array:
        from mflux.models.qwen.model.qwen_transformer.qwen_transformer import QwenTransformer

        inner = self.inner
        hidden = inner.img_in(hidden_states)
        batch = hidden.shape[0]
        timestep = QwenTransformer._compute_timestep(t, config)  # pyright: ignore[reportPrivateUsage]
        timestep = mx.broadcast_to(timestep, (batch,)).astype(hidden.dtype)
        encoder = inner.txt_in(inner.txt_norm(encoder_hidden_states))
        text = inner.time_text_embed(timestep, hidden)
        cond, is_cond = None, None
        if inner.zero_cond_t and cond_image_grid is not None:
            # Qwen-Image-Edit-2511: the reference image's tokens take timestep 0's modulation.
            cond = inner.time_text_embed(mx.zeros_like(timestep), hidden)
            target = (config.height // 16) * (config.width // 16)
            is_cond = (mx.arange(hidden.shape[1]) >= target)[None, :, None]
        rotary = QwenTransformer._compute_rotary_embeddings(  # pyright: ignore[reportPrivateUsage]
            encoder_hidden_states_mask=encoder_hidden_states_mask,
            pos_embed=inner.pos_embed,
            config=config,
            cond_image_grid=cond_image_grid,
        )
        n_text = encoder.shape[1]
        if self.rank > 0:
            joined = mx.distributed.recv_like(
                mx.concatenate([encoder, hidden], axis=1), self.rank - 1, group=self.group
            )
            encoder, hidden = joined[:, :n_text], joined[:, n_text:]
        for offset, block in enumerate(inner.transformer_blocks):
            encoder, hidden = block(
                hidden_states=hidden,
                encoder_hidden_states=encoder,
                encoder_hidden_states_mask=encoder_hidden_states_mask,
                text_embeddings=text,
                image_rotary_emb=rotary,
                block_idx=self.start + offset,
                cond_embeddings=cond,
                is_cond_token=is_cond,
            )
        if self.rank < self.size - 1:
            joined = mx.concatenate([encoder, hidden], axis=1)
            mx.eval(mx.distributed.send(joined, self.rank + 1, group=self.group))
            out_dims = inner.proj_out.weight.shape[0]
            noise = mx.zeros((batch, hidden.shape[1], out_dims), hidden.dtype)
        else:
            noise = inner.proj_out(inner.norm_out(hidden, text))
        return mx.distributed.all_sum(noise, group=self.group)


def split_transformer(model: Any, group: mx.distributed.Group, start: int, end: int) -> None:
    """Make a loaded mflux model (FLUX.1 or Qwen-Image) run only blocks `[start, end)` of its
    transformer."""
    inner = model.transformer
    if hasattr(inner, "single_transformer_blocks"):
        model.transformer = SplitTransformer(inner, group, start, end)
    else:
        model.transformer = SplitQwenTransformer(inner, group, start, end)
