"""The conversion's parts without a process group: architectures, configs, tensor rules, shards, tokenizer
files, sampling, and the tools' refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from megatron_ext.config.arguments import ModelArgs
from megatron_ext.config.data_args import DataArgs
from megatron_ext.data.tokenizers import GPT2BPETokenizer, GPTSentencePieceTokenizer, build_tokenizer
from megatron_ext.huggingface.architectures import ConversionError, TokenIds, architecture, hf_config, model_flags
from megatron_ext.huggingface.convert import ShardWriter, _SafetensorsReader, _staging, parse_size
from megatron_ext.huggingface.tokenizer_files import write_tokenizer
from megatron_ext.huggingface.weights import LAYERS, rules
from megatron_ext.inference.generate import Sampling, generate, next_token
from tests.data.helpers import TIKTOKEN_MERGES, shared_data, tiktoken_vocab

pytestmark = pytest.mark.unit

LLAMA_GQA = ModelArgs(
    num_layers=2, hidden_size=64, num_attention_heads=8, group_query_attention=True, num_query_groups=2,
    position_embedding_type="rope", swiglu=True, normalization="RMSNorm", disable_bias_linear=True,
    untie_embeddings_and_output_weights=True, seq_length=32, rotary_base=500000,
)  # fmt: skip
LLAMA_BIAS_TIED = ModelArgs(
    num_layers=2, hidden_size=64, num_attention_heads=4, kv_channels=32, position_embedding_type="rope",
    swiglu=True, normalization="RMSNorm", ffn_hidden_size=96, seq_length=16,
)  # fmt: skip
LLAMA_31 = ModelArgs(
    num_layers=2, hidden_size=64, num_attention_heads=4, group_query_attention=True, num_query_groups=2,
    position_embedding_type="rope", swiglu=True, normalization="RMSNorm", disable_bias_linear=True,
    seq_length=32, rotary_base=500000, use_rope_scaling=True,
)  # fmt: skip
LLAMA_32 = ModelArgs(
    num_layers=2, hidden_size=64, num_attention_heads=4, group_query_attention=True, num_query_groups=2,
    position_embedding_type="rope", swiglu=True, normalization="RMSNorm", disable_bias_linear=True,
    seq_length=32, rotary_base=500000, use_rope_scaling=True, rope_scaling_factor=32.0,
)  # fmt: skip
QWEN2_TIED = ModelArgs(
    num_layers=2, hidden_size=64, num_attention_heads=4, group_query_attention=True, num_query_groups=2,
    position_embedding_type="rope", swiglu=True, normalization="RMSNorm", disable_bias_linear=True,
    add_qkv_bias=True, seq_length=32, rotary_base=1000000,
)  # fmt: skip
QWEN3 = ModelArgs(
    num_layers=2, hidden_size=64, num_attention_heads=4, group_query_attention=True, num_query_groups=2,
    kv_channels=32, position_embedding_type="rope", swiglu=True, normalization="RMSNorm", disable_bias_linear=True,
    qk_layernorm=True, untie_embeddings_and_output_weights=True, seq_length=32, rotary_base=1000000,
)  # fmt: skip
MISTRAL = ModelArgs(
    num_layers=2, hidden_size=64, num_attention_heads=4, group_query_attention=True, num_query_groups=2,
    position_embedding_type="rope", swiglu=True, normalization="RMSNorm", disable_bias_linear=True,
    untie_embeddings_and_output_weights=True, seq_length=32, window_size="31,0",
)  # fmt: skip
GPT2 = ModelArgs(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32, norm_epsilon=1e-6)
GPT2_UNTIED = ModelArgs(
    num_layers=3, hidden_size=48, num_attention_heads=3, seq_length=16, untie_embeddings_and_output_weights=True
)
GPT2_TANH = ModelArgs(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32, openai_gelu=True)
LLAMA_LINEAR = ModelArgs(
    num_layers=2, hidden_size=64, num_attention_heads=4, position_embedding_type="rope", swiglu=True,
    normalization="RMSNorm", disable_bias_linear=True, seq_length=32, rotary_seq_len_interpolation_factor=4,
)  # fmt: skip
SHAPE_FIELDS = (
    "num_layers", "hidden_size", "effective_ffn_hidden_size", "num_attention_heads", "effective_num_query_groups",
    "effective_kv_channels", "position_embedding_type", "swiglu", "normalization", "norm_epsilon",
    "untie_embeddings_and_output_weights", "disable_bias_linear", "add_qkv_bias", "rotary_base", "use_rope_scaling",
    "rope_scaling_factor", "window_size", "qk_layernorm", "openai_gelu", "rotary_seq_len_interpolation_factor",
)  # fmt: skip


@pytest.mark.parametrize(
    "model",
    [
        LLAMA_GQA,
        LLAMA_BIAS_TIED,
        LLAMA_31,
        LLAMA_32,
        LLAMA_LINEAR,
        QWEN2_TIED,
        QWEN3,
        MISTRAL,
        GPT2,
        GPT2_UNTIED,
        GPT2_TANH,
    ],
    ids=[
        "llama-gqa",
        "llama-bias-tied",
        "llama-3.1-rope-scaling",
        "llama-3.2-tied",
        "llama-linear-rope-scaling",
        "qwen2-tied",
        "qwen3",
        "mistral",
        "gpt2",
        "gpt2-untied",
        "gpt2-gelu-new",
    ],
)
def test_config_round_trip_keeps_the_model(model: ModelArgs) -> None:
    config = hf_config(model, padded_vocab_size=128, tokens=TokenIds(1, 2), dtype="float32")
    arch, flags = model_flags(json.loads(json.dumps(config)))
    assert arch == architecture(model)
    back = ModelArgs(**flags)
    for name in SHAPE_FIELDS:
        if name == "rotary_base" and arch == "gpt2":
            continue
        assert getattr(back, name) == getattr(model, name), name
    assert config["vocab_size"] == 128 and config["eos_token_id"] == 2


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"position_embedding_type": "rope"}, ["without --swiglu", "with LayerNorm"]),
        ({"position_embedding_type": "rope", "swiglu": True, "normalization": "RMSNorm", "rotary_percent": 0.5}, ["--rotary-percent 0.5"]),
        ({"swiglu": True, "disable_bias_linear": True}, ["with --swiglu", "--disable-bias-linear"]),
        ({"group_query_attention": True, "num_query_groups": 2}, ["grouped-query attention"]),
        ({"position_embedding_type": "none"}, ["neither rope nor learned"]),
        ({"apply_layernorm_1p": True}, ["--apply-layernorm-1p"]),
        ({"qk_layernorm": True}, ["--qk-layernorm with learned positions"]),
        ({"position_embedding_type": "rope", "swiglu": True, "normalization": "RMSNorm", "qk_layernorm": True},
         ["--qk-layernorm with biases or a window"]),
        ({"squared_relu": True}, ["--squared-relu"]),
        ({"position_embedding_type": "rope", "swiglu": True, "normalization": "RMSNorm", "use_rope_scaling": True,
          "rotary_seq_len_interpolation_factor": 2}, ["--use-rope-scaling with --rotary-seq-len-interpolation-factor"]),
        ({"window_size": "127,0"}, ["--window-size with learned positions"]),
        ({"position_embedding_type": "rope", "swiglu": True, "normalization": "RMSNorm", "window_size": "127,0"},
         ["--window-size with biases"]),
    ],
)  # fmt: skip
def test_models_without_a_transformers_architecture_are_refused_naming_why(changes: dict, named: list[str]) -> None:
    model = ModelArgs(num_layers=2, hidden_size=64, num_attention_heads=4, **changes)
    with pytest.raises(ConversionError) as err:
        architecture(model)
    for part in [*named, "Supported: Llama", "Qwen2", "Mistral"]:
        assert part in str(err.value)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"activation_function": "relu"}, r"activation_function='relu' \(Megatron's GPT MLP is GeLU"),
        (
            {"model_type": "mistral", "sliding_window": 16},
            r"sliding window 16 is shorter than the sequence length 32 \(max_position_embeddings; import with "
            r"--seq-length 16 or less\): Megatron-Core's local attention has no sliding window",
        ),
        (
            {"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 1},
            "a sliding window on layers 1–1 only",
        ),
        ({"model_type": "olmo2"}, r"model_type 'olmo2': norms after attention and MLP"),
        ({"model_type": "qwen3", "attention_bias": True}, r"attention_bias=True \(biases on the attention projections"),
        ({"model_type": "gemma2"}, "logit soft-capping"),
        ({"model_type": "brand_new"}, r"model_type 'brand_new' is not one of the architectures read here"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 5e5}}, "rope type 'yarn'"),
        (
            {"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.5}},
            r"linear rope scaling by 2.5 \(--rotary-seq-len-interpolation-factor is an integer\)",
        ),
        (
            {
                "rope_parameters": {
                    "rope_type": "llama3",
                    "rope_theta": 5e5,
                    "factor": 32.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 2.0,
                    "original_max_position_embeddings": 8192,
                }
            },
            r"llama3 rope scaling with high_freq_factor=2.0 \(Megatron-Core's is 4.0\)",
        ),
        ({"attention_bias": True, "mlp_bias": False}, "attention_bias ≠ mlp_bias"),
    ],
)
def test_transformers_configs_we_cannot_compute_alike_are_refused(changes: dict, named: str) -> None:
    base = GPT2 if "activation_function" in changes else LLAMA_GQA
    config = hf_config(base, padded_vocab_size=128, tokens=TokenIds(None, 0), dtype="float32") | changes
    with pytest.raises(ConversionError, match=named):
        model_flags(config)


@pytest.mark.parametrize("factor", [8.0, 32.0], ids=["llama-3.1", "llama-3.2"])
def test_llama_3_rope_scaling_is_the_same_frequencies_in_megatron_core_and_transformers(factor: float) -> None:
    """``--use-rope-scaling --rope-scaling-factor`` (Megatron-Core's RotaryEmbedding) and the exported
    ``rope_parameters`` (transformers' llama3 initialisation) rotate by the same frequencies, bit for bit."""
    import dataclasses

    import transformers
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    m = dataclasses.replace(LLAMA_31, rope_scaling_factor=factor)
    kv = m.effective_kv_channels
    ours = RotaryEmbedding(
        kv, rotary_percent=1.0, rotary_base=m.rotary_base, rope_scaling=True, rope_scaling_factor=factor,
        use_cpu_initialization=True,
    )  # fmt: skip
    config = transformers.LlamaConfig(**hf_config(m, padded_vocab_size=128, tokens=TokenIds(1, 2), dtype="float32"))
    theirs, attention_factor = ROPE_INIT_FUNCTIONS["llama3"](config, torch.device("cpu"))
    assert attention_factor == 1.0
    assert torch.equal(ours.inv_freq.float(), theirs.float())
    plain = RotaryEmbedding(kv, rotary_percent=1.0, rotary_base=m.rotary_base, use_cpu_initialization=True)
    assert not torch.equal(plain.inv_freq, ours.inv_freq)  # the scaling does change the long wavelengths


@pytest.mark.parametrize(
    "model",
    [LLAMA_GQA, LLAMA_BIAS_TIED, GPT2, GPT2_UNTIED],
    ids=["llama-gqa", "llama-bias-tied", "gpt2", "gpt2-untied"],
)
def test_every_rule_is_inverted_bit_for_bit(model: ModelArgs) -> None:
    """join(split(t)) is t for every tensor of the model (random values, each tensor's per-layer shape)."""
    d, f = model.effective_kv_channels, model.effective_ffn_hidden_size
    qkv_rows = (model.num_attention_heads + 2 * model.effective_num_query_groups) * d
    shapes = {
        "self_attention.linear_qkv.weight": (qkv_rows, model.hidden_size),
        "self_attention.linear_qkv.bias": (qkv_rows,),
        "self_attention.linear_proj.weight": (model.hidden_size, model.num_attention_heads * d),
        "mlp.linear_fc1.weight": ((2 if model.swiglu else 1) * f, model.hidden_size),
        "mlp.linear_fc1.bias": ((2 if model.swiglu else 1) * f,),
        "mlp.linear_fc2.weight": (model.hidden_size, f),
    }
    table = rules(model)
    assert ("output_layer.weight" in {r.key for r in table}) == model.untie_embeddings_and_output_weights
    for rule in table:
        shape = shapes.get(rule.key.removeprefix(LAYERS), (model.hidden_size,) if "norm" in rule.key else (7, 5))
        t = torch.randn(shape)
        parts = rule.split(t)
        assert len(parts) == len(rule.names(1)) and all(n.count(".1.") == 1 for n in rule.names(1) if rule.per_layer)
        assert torch.equal(rule.join([p.clone() for p in parts]), t), rule.key


def test_grouped_query_heads_go_to_their_own_projection() -> None:
    """Megatron's rows [q_g0 (4 heads), k_g0, v_g0, q_g1, …] → q_proj head h is Megatron's group h // 4, slot h % 4."""
    (rule,) = [r for r in rules(LLAMA_GQA) if r.key == LAYERS + "self_attention.linear_qkv.weight"]
    d, per = 8, 4
    rows = torch.arange((8 + 4) * d, dtype=torch.float32).unsqueeze(1)  # each row holds its own index
    q, k, v = rule.split(rows)
    for head in range(8):
        group, slot = divmod(head, per)
        assert q[head * d, 0] == (group * (per + 2) + slot) * d
    for group in range(2):
        assert k[group * d, 0] == (group * (per + 2) + per) * d
        assert v[group * d, 0] == (group * (per + 2) + per + 1) * d


def test_shards_are_indexed_and_read_back(tmp_path: Path) -> None:
    writer = ShardWriter(tmp_path, max_bytes=1000)
    tensors = {f"t{i}": torch.randn(100 + i) for i in range(5)}  # ~400 bytes each: 3 shards
    for name, t in tensors.items():
        writer.add(name, t)
    files = writer.close()
    assert files[-1] == "model.safetensors.index.json" and len(files) == 4
    assert files[0] == "model-00001-of-00003.safetensors"
    index = json.loads((tmp_path / files[-1]).read_text())
    assert set(index["weight_map"]) == set(tensors) and index["metadata"]["total_size"] == sum(
        t.numel() * 4 for t in tensors.values()
    )
    reader = _SafetensorsReader(tmp_path)
    for name, t in tensors.items():
        assert torch.equal(reader(name), t)
    assert not list(tmp_path.glob("*.tmp"))


def test_a_failed_conversion_leaves_nothing_and_an_existing_output_is_kept(tmp_path: Path) -> None:
    target = tmp_path / "out"
    with pytest.raises(RuntimeError), _staging(target) as staging:
        (staging / "model.safetensors").write_bytes(b"partial")
        raise RuntimeError("interrupted")
    assert not target.exists() and list(tmp_path.iterdir()) == []
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    with pytest.raises(ConversionError, match="already exists and is not empty"), _staging(target):
        pass
    assert [p.name for p in target.iterdir()] == ["keep.txt"]


def test_sizes() -> None:
    assert parse_size("5GB") == 5 * 10**9 and parse_size("2GiB") == 2 * 2**30 and parse_size("512") == 512
    with pytest.raises(ValueError, match="not a size"):
        parse_size("five")


@pytest.mark.parametrize("kind", ["GPTSentencePieceTokenizer", "Llama2Tokenizer"])
def test_sentencepiece_tokenizer_json_gives_our_ids(
    kind: str, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """transformers, on the exported tokenizer.json, encodes and decodes the corpus as our tokenizer (byte
    fallback, runs of spaces, a user-defined piece ending the text; Llama2Tokenizer's BOS first). Text holding the
    control pieces' own spelling (<s>, </s>), and text after a user-defined piece, are the documented exceptions;
    the type comes back on import."""
    import transformers

    from megatron_ext.huggingface.tokenizer_files import read_tokenizer_flags

    shared = shared_data(tmp_path_factory)
    ours = build_tokenizer(kind, tokenizer_model=str(shared["model"]))
    data = DataArgs(mock_data=True, tokenizer_type=kind, tokenizer_model=str(shared["model"]))
    written = write_tokenizer(ours, data, tmp_path, max_length=64)
    sp = ours.sp  # type: ignore[attr-defined]
    assert written.ids == TokenIds(sp.bos_id(), ours.eod)
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    lines = [json.loads(line)["text"] for line in shared["corpus"].read_text(encoding="utf-8").splitlines()]
    edge = [" a", "  two  spaces ", "\n    indented", "tabs\tand\nnewlines", "日本語 😀 é", "x<special>", "", "   "]
    texts = [t for t in [*edge, *lines] if "<s>" not in t and "</s>" not in t]
    assert len(texts) > 400
    for text in texts:
        ids = ours.tokenize(text)
        assert theirs(text)["input_ids"] == ids, text[:80]
        assert theirs.decode(ids, skip_special_tokens=True) == ours.detokenize(ids), text[:80]
    assert theirs.eos_token_id == ours.eod
    assert read_tokenizer_flags(tmp_path, tmp_path / "copy") == {
        "tokenizer_type": kind,
        "tokenizer_model": str(tmp_path / "copy" / "tokenizer.model"),
    }


def test_llama2_tokenizer_starts_every_text_with_bos_in_one_piece_or_many(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Megatron-LM's ``_Llama2Tokenizer.tokenize(s)`` is ``[bos] + encode(s)``; a long text tokenized in pieces
    (bounded memory) gets the BOS once, before the first."""
    shared = shared_data(tmp_path_factory)
    llama = build_tokenizer("Llama2Tokenizer", tokenizer_model=str(shared["model"]))
    plain = GPTSentencePieceTokenizer(shared["model"])
    text = " ".join(json.loads(line)["text"] for line in shared["corpus"].read_text(encoding="utf-8").splitlines())
    assert llama.tokenize(text) == [plain.sp.bos_id(), *plain.tokenize(text)]
    assert [list(a) for a in llama.tokenize_batch(["x y", ""])] == [llama.tokenize("x y"), llama.tokenize("")]
    pieces = list(llama.tokenize_pieces(text, piece_chars=500))
    assert len(pieces) > 3 and [int(i) for p in pieces for i in p] == llama.tokenize(text)
    assert (llama.vocab_size, llama.eod) == (plain.vocab_size, plain.eod)


@pytest.mark.parametrize("pattern", ["v1", "v2"])
def test_tiktoken_tokenizer_json_gives_our_ids_and_the_flags_come_back(
    pattern: str, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """transformers, on the exported tokenizer.json, encodes and decodes the corpus (and bytes the merges never
    saw) as Megatron-LM's TikTokenizer does; the import gives back the same tokenizer flags and vocabulary file."""
    import transformers

    from megatron_ext.cli import convert_checkpoint
    from megatron_ext.config.training_config import parse_args
    from megatron_ext.huggingface.tokenizer_files import TIKTOKEN_VOCAB as TIKTOKEN
    from megatron_ext.huggingface.tokenizer_files import read_tokenizer_flags
    from tests.huggingface.hub_configs import HUB_CONFIGS
    from tests.huggingface.test_real_shapes import printed_command

    vocab = tiktoken_vocab(tmp_path_factory)
    flags = {"tokenizer_model": str(vocab), "tiktoken_pattern": pattern, "tiktoken_num_special_tokens": 10}
    size = 10 + 256 + TIKTOKEN_MERGES - 7  # the last 7 ranks are cut, as --vocab-size cuts them
    special = ("<s>", "</s>", "<unk>", "<|im_end|>")
    ours = build_tokenizer("TikTokenizer", vocab_size=size, special_tokens=special, **flags)  # type: ignore[arg-type]
    data = DataArgs(mock_data=True, tokenizer_type="TikTokenizer", tokenizer_special_tokens=special, **flags)
    written = write_tokenizer(ours, data, tmp_path, max_length=64)
    assert written.ids == TokenIds(0, 1) and "tokenizer.json" in written.files
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    lines = [json.loads(line)["text"] for line in shared_data(tmp_path_factory)["corpus"].read_text().splitlines()]
    edge = [
        " a",
        "  two  spaces ",
        "\n\n    indented\r\n",
        "tabs\tand\nnewlines",
        "日本語 😀 é",
        "x<s",
        "",
        "  ",
        "a <s> b</s>",
    ]
    texts = [*edge, *lines[-300:]]
    for text in texts:
        ids = ours.tokenize(text)
        assert theirs(text)["input_ids"] == ids, text[:80]
        assert theirs.decode(ids) == ours.detokenize(ids) == text, text[:80]
    assert theirs.convert_ids_to_tokens([0, 1, 3, 9]) == ["<s>", "</s>", "<|im_end|>", "<SPECIAL_9>"]
    assert (theirs.eos_token_id, theirs.bos_token_id, len(theirs)) == (ours.eod, ours.bos, size)
    assert read_tokenizer_flags(tmp_path, tmp_path / "copy") == {
        "tokenizer_type": "TikTokenizer",
        "tokenizer_model": str(tmp_path / "copy" / TIKTOKEN),
        "tiktoken_pattern": pattern,
        "tiktoken_num_special_tokens": 10,
        "tokenizer_special_tokens": special,
        "vocab_size": size,
    }
    # The import's dry run prints the flags that continue the model with this tokenizer; pretrain_gpt.py takes them.
    (tmp_path / "config.json").write_text(json.dumps(HUB_CONFIGS["qwen2.5-0.5b"]))
    save = tmp_path / "ckpt"
    assert convert_checkpoint.main(["from-hf", "--input", str(tmp_path), "--save", str(save), "--dry-run"]) == 0
    command = printed_command(capsys.readouterr().out)
    cfg = parse_args([*command[3:], "--mock-data"], world_size=1)
    assert (cfg.data.tokenizer_type, cfg.data.tokenizer_model) == ("TikTokenizer", str(save / "tokenizer" / TIKTOKEN))
    assert (cfg.data.tiktoken_pattern, cfg.data.tiktoken_num_special_tokens) == (pattern, 10)
    assert (cfg.data.tokenizer_special_tokens, cfg.model.vocab_size) == (special, size)


def test_gpt2_bpe_files_give_our_ids(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    import transformers
    from tokenizers import ByteLevelBPETokenizer

    shared = shared_data(tmp_path_factory)
    lines = [json.loads(line)["text"] for line in shared["corpus"].read_text(encoding="utf-8").splitlines()]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(lines[:300], vocab_size=600, special_tokens=["<|endoftext|>"])
    (tmp_path / "bpe").mkdir()
    vocab, merges = bpe.save_model(str(tmp_path / "bpe"))
    ours = GPT2BPETokenizer(vocab, merges)
    out = tmp_path / "hf"
    out.mkdir()
    data = DataArgs(mock_data=True, tokenizer_type="GPT2BPETokenizer", vocab_file=vocab, merge_file=merges)
    written = write_tokenizer(ours, data, out, max_length=64)
    assert written.files == ("vocab.json", "merges.txt", "tokenizer_config.json")
    theirs = transformers.AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    for text in [*lines[300:500], " leading", "a  b", "日本語"]:
        assert theirs(text)["input_ids"] == ours.tokenize(text), text[:80]
    assert theirs.eos_token_id == ours.eod


class _Fixed(torch.nn.Module):
    """A 'model' whose next-token logits are always ``logits``."""

    def __init__(self, logits: list[float]) -> None:
        super().__init__()
        self.logits = torch.tensor(logits)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask: None) -> torch.Tensor:
        return self.logits.expand(tokens.shape[0], tokens.shape[1], -1)


def test_sampling_is_greedy_restricted_and_seeded() -> None:
    logits = torch.tensor([0.0, 3.0, 2.9, 1.0, -5.0])
    g = torch.Generator().manual_seed(0)
    assert next_token(logits, Sampling(), g) == 1
    assert {next_token(logits, Sampling(temperature=5.0, top_k=1), g) for _ in range(20)} == {1}
    assert {next_token(logits, Sampling(temperature=1.0, top_k=2), g) for _ in range(200)} == {1, 2}
    # p = 0.5: token 1 alone holds ~47%, so 1 and 2 are needed; nothing else is ever drawn.
    assert {next_token(logits, Sampling(temperature=1.0, top_p=0.5), g) for _ in range(200)} == {1, 2}
    assert {next_token(logits, Sampling(temperature=1.0, top_p=1e-6), g) for _ in range(20)} == {1}
    model = _Fixed([0.0, 1.0, 1.0, 1.0, 9.0, 9.0])  # the padded rows (4, 5) must never be chosen

    def run(seed: int) -> list[int]:
        sampling = Sampling(temperature=1.0, seed=seed)
        return generate(
            model,
            [0],
            max_new_tokens=30,
            sampling=sampling,
            vocab_size=4,
            window=8,
            stop=None,
            device=torch.device("cpu"),
        )

    assert run(7) == run(7) and run(7) != run(8)
    assert set(run(7)) <= {0, 1, 2, 3} and len(run(7)) == 30
    stopped = generate(
        model, [0], max_new_tokens=30, sampling=Sampling(), vocab_size=4, window=8, stop=1, device=torch.device("cpu")
    )
    assert stopped == [1]
    for bad in ({"temperature": -1.0}, {"top_k": -1}, {"top_p": 1.5}):
        with pytest.raises(ValueError):
            Sampling(**bad)


def test_tools_refuse_bad_input_clearly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Their main functions, as tools/*.py call them (the error paths start no process group)."""
    from megatron_ext.cli import convert_checkpoint, generate

    (tmp_path / "hf").mkdir()
    assert convert_checkpoint.main(["from-hf", "--input", str(tmp_path / "hf"), "--save", str(tmp_path / "c")]) == 2
    assert "has no config.json" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()
    assert generate.main(["--load", str(tmp_path / "none"), "--prompt", "x"]) == 3
    assert "holds no checkpoint" in capsys.readouterr().err
    assert convert_checkpoint.main(["to-hf", "--load", str(tmp_path / "none"), "--output", str(tmp_path / "o")]) == 3
    assert "holds no checkpoint" in capsys.readouterr().err and not (tmp_path / "o").exists()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral", "gpt2"])
def test_a_missing_config_key_means_transformers_default(arch: str) -> None:
    """Every key the importer reads falls back to what transformers itself uses when config.json lacks it (its
    config class's field default: a Qwen2 without num_key_value_heads has 32, a Mistral 8 and a sliding window of
    4096; a GPT-2 without activation_function is gelu_new, imported with --openai-gelu, not as exact GeLU)."""
    import dataclasses

    import transformers

    from megatron_ext.huggingface.architectures import TRANSFORMERS_DEFAULTS

    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config,
           "mistral": transformers.MistralConfig, "gpt2": transformers.GPT2Config}[arch]  # fmt: skip
    fields = {f.name: f.default for f in dataclasses.fields(cls)}
    for key, ours in TRANSFORMERS_DEFAULTS[arch].items():
        if key == "rope_theta":  # transformers 5 keeps it in rope_parameters, from the class's default
            theirs = cls.default_theta
        else:  # Qwen2 has no head_dim field: its attention takes hidden ÷ heads unless config.json names one
            assert key in fields or (arch, key) == ("qwen2", "head_dim"), (arch, key)
            theirs = fields.get(key)
        assert ours == theirs, (arch, key, ours, theirs)
    model = {"llama": LLAMA_GQA, "qwen2": QWEN2_TIED, "qwen3": QWEN3, "mistral": MISTRAL, "gpt2": GPT2_UNTIED}[arch]
    exported = hf_config(model, padded_vocab_size=128, tokens=TokenIds(1, 2), dtype="float32")
    for key, default in TRANSFORMERS_DEFAULTS[arch].items():
        if key == "rope_theta" or (arch, key) == ("qwen2", "head_dim"):
            # transformers itself tells them apart: a top-level rope_theta overrides rope_parameters' (an absent one
            # does not); Qwen2 takes an absent head_dim as hidden ÷ heads and cannot build an explicit null.
            continue
        without = {k: v for k, v in exported.items() if k != key}
        explicit = without | {key: default}
        outcomes = []
        for config in (without, explicit):
            try:
                outcomes.append(model_flags(config))
            except ConversionError as exc:
                outcomes.append(str(exc).replace(" (transformers' default: the key is absent)", ""))
        assert outcomes[0] == outcomes[1], key


def test_a_gpt2_config_without_activation_function_is_gelu_new_and_imported_with_openai_gelu() -> None:
    config = hf_config(GPT2, padded_vocab_size=128, tokens=TokenIds(None, 0), dtype="float32")
    assert config["activation_function"] == "gelu"
    del config["activation_function"]
    assert model_flags(config)[1]["openai_gelu"]
    assert "openai_gelu" not in model_flags(config | {"activation_function": "gelu"})[1]


def test_configs_are_read_as_transformers_reads_them() -> None:
    """GPT-2's size aliases; rope_scaling before rope_parameters and the top-level rope keys over the dict's (as
    ``convert_rope_params_to_dict``); a Mistral without a window stays a Mistral; --seq-length for GPT-2 too."""
    gpt2 = hf_config(GPT2, padded_vocab_size=128, tokens=TokenIds(None, 0), dtype="float32")
    aliased = {k: v for k, v in gpt2.items() if k != "n_head"} | {"num_attention_heads": 2}
    assert model_flags(aliased)[1]["num_attention_heads"] == 2
    assert model_flags(gpt2, seq_length=8)[1]["seq_length"] == 8

    llama = hf_config(LLAMA_GQA, padded_vocab_size=128, tokens=TokenIds(1, 2), dtype="float32")
    scaled = hf_config(LLAMA_31, padded_vocab_size=128, tokens=TokenIds(1, 2), dtype="float32")
    both = llama | {"rope_scaling": scaled["rope_scaling"], "rope_theta": 500000.0}
    assert model_flags(both)[1]["use_rope_scaling"]  # rope_scaling wins over the plain rope_parameters
    with pytest.raises(ConversionError, match=r"original_max_position_embeddings=2048 \(Megatron-Core's is 8192\)"):
        model_flags(scaled | {"original_max_position_embeddings": 2048})

    mistral = hf_config(MISTRAL, padded_vocab_size=128, tokens=TokenIds(1, 2), dtype="float32") | {
        "sliding_window": None
    }
    arch, flags = model_flags(mistral)
    assert (arch, flags["window_size"]) == ("mistral", "-1,0")
    assert (
        hf_config(ModelArgs(**flags), padded_vocab_size=128, tokens=TokenIds(1, 2), dtype="float32")["model_type"]
        == "mistral"
    )


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"model_type": "qwen3", "head_dim": None}, r"head_dim=null \(transformers cannot build this config"),
        ({"quantization_config": {"quant_method": "awq"}}, r"quantization_config \(awq\): quantized weights"),
    ],
)
def test_configs_transformers_cannot_build_or_that_hold_no_weights_of_ours_are_refused(
    changes: dict, named: str
) -> None:
    config = hf_config(LLAMA_GQA, padded_vocab_size=128, tokens=TokenIds(1, 2), dtype="float32") | changes
    with pytest.raises(ConversionError, match=named):
        model_flags(config)


NOT_THE_FUNCTION = {
    "_attn_implementation": "which attention kernel computes it",
    "pad_token_id": "the embedding's padding row: its gradient in transformers, nothing in the forward pass",
    "use_cache": "the key/value cache of generation",
    "embd_pdrop": "dropout, off in the forward pass that is compared (training uses --hidden-dropout)",
    **dict.fromkeys(
        (
            "classifier_dropout",
            "hidden_dropout",
            "num_labels",
            "problem_type",
            "summary_activation",
            "summary_first_dropout",
            "summary_last_dropout",
            "summary_proj_to_labels",
            "summary_type",
            "summary_use_proj",
        ),
        "the heads of GPT-2's other tasks (classification, double heads), not GPT2LMHeadModel",
    ),
}
"""Config attributes the modelling code reads that do not change the language model's logits."""


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral", "gpt2"])
def test_every_config_key_the_modelling_code_reads_is_read_here(arch: str) -> None:
    """Every ``config.X`` of the installed ``modeling_ARCH.py`` is read by the importer (``TRANSFORMERS_DEFAULTS``,
    ``READ_ELSEWHERE``) or named above as not changing the function: a new key in a new transformers release
    fails here instead of being imported silently."""
    import importlib
    import inspect
    import re

    from megatron_ext.huggingface.architectures import READ_ELSEWHERE, TRANSFORMERS_DEFAULTS

    source = inspect.getsource(importlib.import_module(f"transformers.models.{arch}.modeling_{arch}"))
    keys = set(re.findall(r"config\.(\w+)", source)) | set(
        re.findall(r'getattr\(\s*(?:self\.)?config,\s*"(\w+)"', source)
    )
    assert keys, arch
    unread = sorted(keys - set(TRANSFORMERS_DEFAULTS[arch]) - READ_ELSEWHERE - set(NOT_THE_FUNCTION))
    assert unread == [], f"{arch}: transformers reads {unread}; read them in architectures.py or explain them here"
