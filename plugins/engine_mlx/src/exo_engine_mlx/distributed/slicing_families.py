"""What differs per family when a pipeline splits a model, as data: each family's `Slicing`
(which parts are its inner model, embedding, layers and norm; its mask indices re-found on a
slice; an embedding scale; caches only in some layers; a forward or head of its own) in
`SLICED_MODEL_TYPES`, and the llama-shaped types `PipelineStage` re-implements
(`PIPELINE_MODEL_TYPES`). `SlicedStage` (pipeline.py) reads them; slicing_hybrid,
slicing_state and slicing_windows hold the longer per-family functions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import mlx.core as mx

from exo_engine_mlx.distributed import slicing_forwards as forwards
from exo_engine_mlx.distributed import slicing_hybrid as hybrid
from exo_engine_mlx.distributed import slicing_state as state
from exo_engine_mlx.distributed import slicing_windows as windows

# Model types whose inner model is embed_tokens -> layers(h, mask, cache) -> norm, with an
# lm_head or tied embeddings: the shape this stage re-implements.
PIPELINE_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})


@dataclass(frozen=True)
class Slicing:
    """How `SlicedStage` cuts one family. By default the family's own inner forward runs on
    the rank's slice, one cache per layer, the head is its lm_head or tied embedding."""

    inner: str = "model"  # the text model's attribute holding the layer stack
    layers: str = "layers"  # the inner model's list of layers (Qwen 1: h; PLaMo: layers.layers)
    embedding: str = "embed_tokens"
    norm: str | None = "norm"  # None: the inner model has no final norm (Phixtral's is in its head)
    # After the cut: re-find the mask indices the inner forward reads (None: its masks come
    # from its first cache, right for any slice).
    reindex: Callable[[Any], None] | None = None
    # The inner forward multiplies the embedding by sqrt(args.hidden_size) (Gemma): a later
    # rank receives an already scaled hidden state, so it must see a scale of 1.
    scaled_embedding: bool = False
    # The args entry the inner forward multiplies the embedding by (MiniCPM's scale_emb): a
    # later rank sees 1 there, for the same reason.
    embedding_scale: str | None = None
    # Attributes of the inner model itself that scale the embedding (granite's embedding_multiplier):
    # a later rank receives an already scaled hidden state, so they are 1 there.
    embedding_scales: tuple[str, ...] = ()
    hidden_size: str = "hidden_size"  # the args entry of the hidden width (OpenELM: model_dim)
    vocab_size: str = "vocab_size"  # the args entry of the vocabulary size (Phixtral: num_vocab)
    # A learned position embedding the inner forward adds to the token embedding (GPT-2's
    # wpe): only the first rank adds it, at positions from its first cache's offset.
    positions: str | None = None
    # Modules of the inner model that make its head (GPT-NeoX's embed_out): dropped before
    # the last rank, where the family's own forward (`family_head`) runs them.
    inner_head: tuple[str, ...] = ()
    # A list of layers after `layers` that attend over the KV cache of the last of them
    # (AFM 7's kv_reuse_layers): the slice continues into it, and the split points are
    # moved so the last rank holds that layer and the whole list (`kv_reuse_counts`).
    reuse_layers: str | None = None
    forward: Callable[[Any, mx.array, list[Any] | None], mx.array] | None = None
    caches: Callable[[Any], list[Any]] | None = None  # this rank's caches, from its inner model
    caches_per_layer: bool = True  # False: only some layers hold a cache (Nemotron-H)
    head: Callable[[Any, mx.array], mx.array] | None = None  # (text model, last hidden) -> logits
    # The last rank runs the family's own model call (on its slice, the received hidden state
    # standing in for the embedding), so the head is the family's own: a logit scale or soft
    # cap included, which greedy tokens alone would not show.
    family_head: bool = False
    # (text model) -> the width of what a rank hands the next, where the forward packs more
    # than the hidden state (slicing_state: Talkie, RWKV-7, Gemma 3n/4); None: the hidden width.
    handoff: Callable[[Any], int] | None = None


_GEMMA = Slicing(scaled_embedding=True)
# The family's own forward and head on a slice of its layers, nothing else to adjust: proven
# per family by test_every_family_groups (2 ranks, layers 1 + 3, equal greedy tokens).
_OWN = Slicing(family_head=True)
_OWN_FAMILIES = (
    "apertus", "bitnet", "cohere", "deepseek", "dots1", "ernie4_5", "ernie4_5_moe", "glm", "glm4",
    "helium", "hunyuan", "hunyuan_v1_dense", "internlm3", "Klear", "llama4_text",
)  # fmt: skip
_OTHER_NAMES = {
    # AFMoE scales the embedding by sqrt(its hidden_size attribute, used for nothing else).
    "afmoe": Slicing(
        family_head=True, embedding_scales=("hidden_size",), reindex=forwards.afmoe_indices
    ),
    "gptj": Slicing(
        family_head=True, layers="h", embedding="wte", norm="ln_f", hidden_size="n_embd"
    ),
    "exaone": Slicing(
        family_head=True, inner="transformer", layers="h", embedding="wte", norm="ln_f"
    ),
    "dbrx": Slicing(
        family_head=True,
        inner="transformer",
        layers="blocks",
        embedding="wte",
        norm="norm_f",
        hidden_size="d_model",
    ),
    "granite": Slicing(family_head=True, embedding_scales=("embedding_multiplier",)),
    # Phi-3 Small scales the embedding by its mup_embedding_multiplier; its head (the tied
    # embedding over mup_width_multiplier, the dummy ids at -inf) is the family's own.
    "phi3small": Slicing(
        family_head=True, norm="final_layernorm", embedding_scales=("mup_embedding_multiplier",)
    ),
    "granitemoe": Slicing(family_head=True, embedding_scales=("embedding_multiplier",)),
    "bailing_moe": Slicing(family_head=True, embedding="word_embeddings"),
    "internlm2": Slicing(family_head=True, embedding="tok_embeddings"),
}
# GPT-2's layout: blocks in `h`, a learned position embedding `wpe` (first rank only).
_GPT2 = Slicing(
    family_head=True,
    layers="h",
    embedding="wte",
    norm="ln_f",
    hidden_size="n_embd",
    positions="wpe",
)
# Sliding-window patterns, position embeddings, heads inside the inner model, KV reuse
# (`slicing_windows`): each proven on 2 ranks by test_every_family_groups.
_WINDOWS_AND_POSITIONS = {
    "cohere2": Slicing(
        forward=windows.cohere2_forward, caches=windows.cohere2_caches, head=windows.cohere2_head
    ),
    "exaone4": Slicing(family_head=True, reindex=windows.exaone4_indices),
    "exaone_moe": Slicing(family_head=True, reindex=windows.exaone_moe_indices),
    "laguna": Slicing(family_head=True, reindex=windows.laguna_indices),
    # Gear scales the embedding by sqrt(width) (its embed_scale) and caps its logits softly.
    "gear": Slicing(
        family_head=True, reindex=windows.gear_indices, embedding_scales=("embed_scale",)
    ),
    "gpt2": _GPT2,
    "gpt_bigcode": replace(_GPT2, inner="transformer"),  # GPT-2's layout one level down
    "gpt_neox": Slicing(
        family_head=True,
        layers="h",
        embedding="embed_in",
        norm="final_layer_norm",
        inner_head=("embed_out",),
    ),
    "lille-130m": Slicing(
        family_head=True,
        inner="transformer",
        embedding="tok_embeddings",
        hidden_size="n_embd",
        forward=windows.lille_forward,
    ),
    "phixtral": Slicing(
        family_head=True,
        inner="transformer",
        layers="h",
        embedding="embd",
        norm=None,
        hidden_size="model_dim",
        vocab_size="num_vocab",
        forward=windows.phixtral_forward,
    ),
    "afm7": Slicing(
        family_head=True,
        embedding="embedding",
        norm="output_norm",
        hidden_size="hidden_dim",
        reuse_layers="kv_reuse_layers",
    ),
}
_GENERIC = Slicing()
_GEMMA4 = Slicing(
    reindex=state.gemma4_reindex,
    forward=state.gemma4_forward,
    caches=state.gemma4_caches,
    caches_per_layer=False,  # KV-shared layers hold none
    head=state.gemma4_head,
    handoff=state.gemma4_handoff,
)


def _hybrid(**how: Any) -> Slicing:
    # The None past the caches is added by our forward, which the family's own model call
    # would bypass: the head is the lm_head / tied embedding (these families do not scale it).
    return Slicing(forward=hybrid.none_past_caches, **how)


_SSM = Slicing(inner="backbone", embedding="embeddings", norm="norm_f", caches=forwards.ssm_caches)
# Families `SlicedStage` splits, each proven on 2 ranks by test_every_family_groups.
SLICED_MODEL_TYPES: dict[str, Slicing] = {
    "gpt_oss": Slicing(reindex=forwards.gpt_oss_indices),
    "minimax": Slicing(),
    "step3p5": Slicing(reindex=forwards.step3p5_indices),
    "gemma": _GEMMA,
    "gemma2": Slicing(scaled_embedding=True, head=forwards.gemma2_head),
    "gemma3_text": Slicing(
        scaled_embedding=True, forward=forwards.gemma3_forward, caches=forwards.gemma3_caches
    ),
    "gemma3": Slicing(
        scaled_embedding=True, forward=forwards.gemma3_forward, caches=forwards.gemma3_caches
    ),
    "nemotron_h": Slicing(
        inner="backbone",
        embedding="embeddings",
        norm="norm_f",
        reindex=forwards.nemotron_h_indices,
        forward=forwards.nemotron_h_forward,
        caches_per_layer=False,
    ),
    **{name: _OWN for name in _OWN_FAMILIES},
    **_OTHER_NAMES,
    **_WINDOWS_AND_POSITIONS,
    # The family's own forward unchanged on a slice (its masks come from its first cache).
    **{
        t: _GENERIC
        for t in (
            "mimo",
            "mixtral",
            "nanbeige",
            "nemotron",
            "olmo2",
            "olmoe",
            "phi3",
            "phimoe",
            "qwen2_moe",
            "seed_oss",
            "smollm3",
            "stablelm",
            "starcoder2",
            "telechat3",
            # Multimodal wrappers around a llama / qwen3 / (llama or ministral3) text model.
            "pixtral",
            "qwen3_vl",
            "mistral3",
        )
    },
    "phi": Slicing(norm="final_layernorm"),
    # Llama 4 (the multimodal wrapper; llama4_text is another module): chunked attention.
    "llama4": Slicing(forward=forwards.llama4_forward, caches=forwards.llama4_caches),
    "olmo3": Slicing(reindex=forwards.olmo3_indices),
    "minicpm": Slicing(embedding_scale="scale_emb", head=forwards.minicpm_head),
    "minicpm3": Slicing(embedding_scale="scale_emb", head=forwards.minicpm_head),
    "nemotron-nas": Slicing(caches_per_layer=False),  # a no-op attention holds no cache
    "youtu_llm": _GENERIC,
    "muse_glimmer": Slicing(forward=forwards.muse_glimmer_forward, head=forwards.muse_glimmer_head),
    "recurrent_gemma": Slicing(
        norm="final_norm",
        forward=forwards.recurrent_gemma_forward,
        head=forwards.recurrent_gemma_head,
    ),
    "plamo": Slicing(layers="layers.layers"),  # a decoder module holds PLaMo's layer list
    "plamo2": Slicing(
        layers="layers.layers", reindex=forwards.plamo2_indices, forward=forwards.plamo2_forward
    ),
    "plamo3": Slicing(layers="layers.layers", reindex=forwards.plamo3_indices),
    "nanochat": Slicing(
        inner="transformer",
        layers="h",
        embedding="wte",
        forward=forwards.nanochat_forward,
        head=forwards.nanochat_head,
    ),
    "qwen": Slicing(inner="transformer", layers="h", embedding="wte", norm="ln_f"),
    "openelm": Slicing(inner="transformer", embedding="token_embeddings", hidden_size="model_dim"),
    "mellum": Slicing(reindex=forwards.mellum_indices),
    "spark2_5": Slicing(embedding="embedding", reindex=forwards.spark2_5_indices),
    "olmo_hybrid": Slicing(reindex=forwards.olmo_hybrid_indices),
    "mimo_v2_flash": Slicing(reindex=forwards.mimo_v2_flash_indices),
    "mamba": _SSM,
    "mamba2": _SSM,
    **{
        # families8: layers that read more than the hidden state before them (slicing_state).
        "talkie": Slicing(
            layers="blocks",
            embedding="embed",
            forward=state.talkie_forward,
            head=state.talkie_head,
            handoff=state.twice_the_width,
        ),
        "rwkv7": Slicing(
            embedding="embeddings", forward=state.rwkv7_forward, handoff=state.twice_the_width
        ),
        "longcat_flash": Slicing(family_head=True),  # two attention blocks per layer
        "iquestloopcoder": Slicing(forward=state.loopcoder_forward, caches_per_layer=False),
        "longcat_flash_ngram": Slicing(
            embedding="ngram_embeddings",
            forward=state.longcat_ngram_forward,
            caches=state.longcat_ngram_caches,
            caches_per_layer=False,
        ),
        "gemma4": _GEMMA4,
        "gemma4_text": _GEMMA4,
        "gemma3n": Slicing(
            inner="model.language_model",
            reindex=state.gemma3n_reindex,
            forward=state.gemma3n_forward,
            caches=state.gemma3n_caches,
            caches_per_layer=False,
            head=state.gemma3n_head,
            handoff=state.gemma3n_handoff,
        ),
        # --- Hybrid attention + SSM / linear-attention stacks (`slicing_hybrid`). ---
        # The forward's mask indices re-found on the slice; a kind the slice lacks gets None
        # or an index past its caches (`none_past_caches`).
        "lfm2": _hybrid(norm="embedding_norm", reindex=hybrid.lfm2_indices),
        "lfm2_moe": _hybrid(norm="embedding_norm", reindex=hybrid.lfm2_indices),
        "lfm2-vl": _hybrid(norm="embedding_norm", reindex=hybrid.lfm2_indices),  # wraps lfm2
        "jamba": _hybrid(norm="final_layernorm", reindex=hybrid.jamba_indices),
        "kimi_linear": _hybrid(reindex=hybrid.kimi_linear_indices),
        # These forwards accept None for a kind the slice lacks: the family's own head runs.
        "granitemoehybrid": Slicing(
            family_head=True,
            embedding_scales=("embedding_multiplier",),
            reindex=hybrid.granitemoehybrid_indices,
        ),
        "bailing_moe_v3": Slicing(
            family_head=True, embedding="word_embeddings", reindex=hybrid.bailing_moe_v3_indices
        ),
        # Its own forward on the slice: positions from a global layer's cache or a cache
        # of its own (one more than the layers: `caches_per_layer=False`).
        "bailing_moe_linear": Slicing(
            embedding="word_embeddings",
            forward=hybrid.bailing_moe_linear_forward,
            caches=hybrid.bailing_moe_linear_caches,
            caches_per_layer=False,
        ),
        # Every layer holds a conv/SSM state and a KV cache together (a CacheList).
        "falcon_h1": Slicing(
            family_head=True, norm="final_layernorm", caches=hybrid.falcon_h1_caches
        ),
        "baichuan_m1": Slicing(
            family_head=True, reindex=hybrid.baichuan_m1_indices, caches=hybrid.baichuan_m1_caches
        ),
    },
}
