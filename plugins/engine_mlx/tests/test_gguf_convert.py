"""GGUF -> MLX conversion of tiny random llamas: loading, bit-exact weights, logits, refusals.

Logit tolerance: MLX computes in float32, the numpy reference in float64 on the same
dequantized values, so the only gap is float32 rounding. Measured max |diff| / max |logit|
is ~4e-7 for every type here; we assert 1e-4, far below the ~1 relative error a wrong RoPE
layout gives (checked by the negative control below).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest

from exo_engine_mlx.gguf import (
    GGUFImportError,
    gguf_model_card_fields,
    import_gguf,
    import_gguf_cli,
    read_marker,
)

REL_TOL = 1e-4
PROMPT = "hello world 123 🙂 東京 the quick fox"

SPECS = {
    "f32": dict(weight_type="F32", embd_type="F32"),
    "f16": dict(weight_type="F16", embd_type="F16"),
    "q8_0": dict(weight_type="Q8_0", embd_type="Q8_0"),
    "q4_0": dict(weight_type="Q4_0", embd_type="Q8_0"),
    "q4_1_tied": dict(weight_type="Q4_1", embd_type="Q8_0", tied=True),
    "q4_1_f32_embd": dict(weight_type="Q4_1", embd_type="F32"),
}

MakeGGUF = Callable[..., Path]


def _logits(model_dir: Path, ids: list[int], **config: object) -> np.ndarray:
    model, _ = mlx_lm.load(str(model_dir), model_config=dict(config) if config else None)[:2]
    out = model(mx.array([ids]))[0]
    return np.array(out.astype(mx.float32))


@pytest.mark.parametrize("name", list(SPECS))
def test_converted_model_matches_reference(
    name: str,
    tiny_gguf: MakeGGUF,
    llama_reference: Callable[[Path, list[int]], np.ndarray],
    tmp_path: Path,
) -> None:
    src = tiny_gguf(**SPECS[name])
    out = import_gguf(src, tmp_path / "model", "test/tiny")
    model, tokenizer = mlx_lm.load(str(out))[:2]
    ids = tokenizer.encode(PROMPT)
    assert len(ids) > 8
    got = np.array(model(mx.array([ids]))[0].astype(mx.float32))
    ref = llama_reference(src, ids)
    rel = np.abs(got - ref).max() / np.abs(ref).max()
    assert rel < REL_TOL, f"{name}: relative logit error {rel:.2e}"
    assert (got.argmax(-1) == ref.argmax(-1)).all()
    # The untied head gives varied predictions (a tied random model echoes its input).
    if not SPECS[name].get("tied"):
        assert len(set(got.argmax(-1).tolist())) > 1


def test_wrong_rope_layout_is_detected(
    tiny_gguf: MakeGGUF, llama_reference: Callable[[Path, list[int]], np.ndarray], tmp_path: Path
) -> None:
    """Negative control: the reference must notice rope_traditional=False."""
    src = tiny_gguf(**SPECS["f32"])
    out = import_gguf(src, tmp_path / "model", "test/tiny")
    ids = list(range(3, 40))
    ref = llama_reference(src, ids)
    wrong = _logits(out, ids, rope_traditional=False)
    assert np.abs(wrong - ref).max() / np.abs(ref).max() > 100 * REL_TOL


@pytest.mark.parametrize("name", ["f16", "q4_1_tied", "q4_0"])
def test_weights_bit_exact(name: str, tiny_gguf: MakeGGUF, tmp_path: Path) -> None:
    src = tiny_gguf(**SPECS[name])
    out = import_gguf(src, tmp_path / "model", "test/tiny")
    raw = mx.load(str(src))
    saved = mx.load(str(out / "model.safetensors"))
    assert isinstance(raw, dict) and isinstance(saved, dict)
    assert len(saved) == len(raw)
    for key, arr in saved.items():
        assert arr.dtype not in (mx.float16, mx.bfloat16), key  # never fp16 on the CPU
    pairs = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.layers.0.self_attn.q_proj.weight": "blk.0.attn_q.weight",
        "model.layers.1.mlp.down_proj.weight": "blk.1.ffn_down.weight",
        "model.norm.weight": "output_norm.weight",
    }
    if "q" in name:
        pairs["model.layers.0.self_attn.q_proj.scales"] = "blk.0.attn_q.scales"
        pairs["model.layers.0.self_attn.q_proj.biases"] = "blk.0.attn_q.biases"
        pairs["model.embed_tokens.biases"] = "token_embd.biases"
    for ours, theirs in pairs.items():
        a, b = saved[ours], raw[theirs]
        assert a.shape == b.shape, ours
        if b.dtype == mx.float16:
            b = b.astype(mx.float32)  # fp16 -> fp32 is exact
        assert a.dtype == b.dtype, ours
        assert mx.array_equal(a, b).item(), ours


def test_config_and_files(tiny_gguf: MakeGGUF, tmp_path: Path) -> None:
    src = tiny_gguf(**SPECS["q4_1_tied"])
    out = import_gguf(src, tmp_path / "m", "org/tiny")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["rope_traditional"] is True
    assert config["tie_word_embeddings"] is True
    assert config["num_hidden_layers"] == 2 and config["hidden_size"] == 64
    assert config["num_attention_heads"] == 4 and config["num_key_value_heads"] == 2
    quant = config["quantization"]
    assert quant["model.embed_tokens"] == {"group_size": 32, "bits": 8, "mode": "affine"}
    assert quant["model.layers.0.self_attn.q_proj"]["bits"] == 4
    assert "model.norm" not in quant
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    assert tok_config["eos_token"] == "<|im_end|>"
    assert "<|im_start|>" in tok_config["chat_template"]
    marker = read_marker(out)
    assert marker is not None and marker["model_id"] == "org/tiny"
    # Nothing left beside the output.
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_chat_template_and_eos_via_mlx_lm(tiny_gguf: MakeGGUF, tmp_path: Path) -> None:
    out = import_gguf(tiny_gguf(**SPECS["q8_0"]), tmp_path / "m", "t")
    _, tokenizer = mlx_lm.load(str(out))[:2]
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert 2 in tokenizer.eos_token_ids


def test_reimport_replaces_atomically(tiny_gguf: MakeGGUF, tmp_path: Path) -> None:
    out = tmp_path / "m"
    import_gguf(tiny_gguf(**SPECS["f32"]), out, "a")
    import_gguf(tiny_gguf(**SPECS["q4_0"]), out, "b")
    marker = read_marker(out)
    assert marker is not None and marker["model_id"] == "b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_card_fields(tiny_gguf: MakeGGUF) -> None:
    src = tiny_gguf(**SPECS["q4_0"])
    card = gguf_model_card_fields(src)
    assert (card.n_layers, card.hidden_size, card.n_heads, card.n_kv_heads) == (2, 64, 4, 2)
    assert card.vocab_size > 256
    assert card.size_bytes == src.stat().st_size
    assert card.dense_fp32_bytes == 4 * card.n_params
    assert card.as_dict()["n_layers"] == 2


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (dict(arch="qwen2"), "unsupported architecture 'qwen2'"),
        (dict(tokenizer_model="llama"), "SentencePiece"),
        (dict(pre="some-new-pre"), "unsupported BPE pre-tokenizer 'some-new-pre'"),
        (dict(extra_tensor_type="Q4_K"), "unsupported tensor type(s) Q4_K"),
        (dict(weight_type="Q5_0"), "unsupported tensor type(s) Q5_0"),
        (
            dict(overrides={"llama.rope.scaling.type": "yarn"}),
            "unsupported RoPE scaling 'yarn'",
        ),
    ],
)
def test_refusals(spec: dict[str, Any], message: str, tiny_gguf: MakeGGUF, tmp_path: Path) -> None:
    with pytest.raises(GGUFImportError) as err:
        import_gguf(tiny_gguf(**spec), tmp_path / "m", "x")
    assert message in str(err.value)
    assert list(tmp_path.iterdir()) == []  # no half-written output


def test_not_a_gguf(tmp_path: Path) -> None:
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(GGUFImportError, match="not a GGUF file"):
        import_gguf(bad, tmp_path / "m", "x")


def test_cli(tiny_gguf: MakeGGUF, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tiny_gguf(**SPECS["q4_0"])
    assert import_gguf_cli([str(src), "--model-id", "org/tiny"], models_dir=tmp_path) == 0
    marker = read_marker(tmp_path / "org--tiny")
    assert marker is not None and marker["model_id"] == "org/tiny"
    bad = tiny_gguf(arch="qwen2")
    assert import_gguf_cli([str(bad), "--model-id", "x", "--out", str(tmp_path / "x")]) == 2
    assert "unsupported architecture 'qwen2'" in capsys.readouterr().err
