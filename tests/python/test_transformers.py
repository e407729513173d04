"""The transformers hook (tileattn.integrations.transformers): small random Llama/Mistral models run with
attn_implementation="tileattn" against the same weights run with "sdpa" in float64 on the CPU (the oracle;
eager attention turns left padding into NaN) and with "sdpa" in the test dtype (the baseline of DESIGN's
tolerance rule). Skipped without PyTorch or transformers."""

import copy
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import tileattn  # noqa: E402
import tileattn.integrations.transformers as hf  # noqa: E402
from conftest import CPU_BACKENDS, UNSUPPORTED  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
DTYPE = {"cpu": torch.float32, "cuda": torch.bfloat16}
FLOOR = {torch.float32: 1e-4, torch.bfloat16: 2e-2}

hf.register()


@pytest.fixture
def seeded(rng):
    torch.manual_seed(int(rng.integers(0, 2**62)))


def backend(device, entry="forward"):
    return tileattn.use_backend(CPU_BACKENDS[entry] if device == "cpu" else "auto")


def skip_unsupported(e):
    if isinstance(e, tileattn.Error) and UNSUPPORTED.search(str(e)):
        pytest.skip(f"backend: {e}")
    raise e


def llama_config(**kw):
    # 4 query heads over 2 KV heads (grouped-query), head dim 16.
    return transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, **kw)


def models(config, device, model_class=transformers.LlamaForCausalLM):
    """{"tileattn", "sdpa"} in the device's test dtype and "oracle" (sdpa, float64, CPU), one set of weights."""
    state = model_class(copy.deepcopy(config)).state_dict()

    def build(impl, dtype, dev):
        m = model_class._from_config(copy.deepcopy(config), attn_implementation=impl)
        m.load_state_dict(state)
        return m.to(device=dev, dtype=dtype).eval()
    return {"tileattn": build("tileattn", DTYPE[device], device), "sdpa": build("sdpa", DTYPE[device], device),
            "oracle": build("sdpa", torch.float64, "cpu")}


def logits(model, **inputs):
    dev = next(model.parameters()).device
    with torch.no_grad():
        return model(**{k: v.to(dev) if torch.is_tensor(v) else v for k, v in inputs.items()}).logits.double().cpu()


def check_rule(x, baseline, oracle, dtype):
    """DESIGN.md: |x - oracle| <= 2 |baseline - oracle| + floor."""
    e, eb = ((y - oracle).abs().max().item() for y in (x, baseline))
    bound = 2 * eb + FLOOR[dtype]
    assert e <= bound, f"max abs error {e} vs bound {bound} (2 x baseline {eb} + floor {FLOOR[dtype]})"


def compare_models(ms, device, select=lambda x: x, **inputs):
    try:
        with backend(device):
            ours = logits(ms["tileattn"], **inputs)
    except tileattn.Error as e:
        skip_unsupported(e)
    check_rule(select(ours), select(logits(ms["sdpa"], **inputs)), select(logits(ms["oracle"], **inputs)),
               DTYPE[device])


@pytest.mark.parametrize("device", DEVICES)
def test_causal_lm_logits(seeded, device):
    ids = torch.randint(0, 128, (3, 37))
    compare_models(models(llama_config(), device), device, input_ids=ids)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch(seeded, device, side):
    ids = torch.randint(0, 128, (3, 29))
    mask = torch.ones_like(ids)
    for b, pad in ((0, 5), (2, 11)):
        if side == "left":
            mask[b, :pad] = 0
        else:
            mask[b, -pad:] = 0
    real = mask.bool()
    compare_models(models(llama_config(), device), device, select=lambda x: x[real], input_ids=ids,
                   attention_mask=mask)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("given_as", ["position_ids", "cu_seq_lens"])
def test_packed_sequences_do_not_see_each_other(seeded, device, given_as):
    lengths = [7, 12, 1, 9]
    ids = torch.randint(0, 128, (1, sum(lengths)))
    ms = models(llama_config(), device)
    position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
    inputs = dict(input_ids=ids, position_ids=position_ids)
    if given_as == "cu_seq_lens":
        cu = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
        inputs.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(lengths), max_length_k=max(lengths))
    try:
        with backend(device):
            ours = logits(ms["tileattn"], **inputs)
    except tileattn.Error as e:
        skip_unsupported(e)
    # Each sequence on its own is the truth: packing must change nothing.
    pieces = ids.split(lengths, dim=1)
    oracle = torch.cat([logits(ms["oracle"], input_ids=p) for p in pieces], dim=1)
    baseline = torch.cat([logits(ms["sdpa"], input_ids=p) for p in pieces], dim=1)
    check_rule(ours, baseline, oracle, DTYPE[device])


@pytest.mark.parametrize("device", DEVICES)
def test_decoding_with_a_cache(seeded, device):
    """Prefill, then one token at a time against the cache: each step's logits equal the full forward's
    (the query row aligns to the bottom-right corner of its keys)."""
    ids = torch.randint(0, 128, (2, 21))
    ms = models(llama_config(), device)
    model = ms["tileattn"]
    dev = next(model.parameters()).device
    try:
        with backend(device, "decode"), backend(device), torch.no_grad():
            cache = transformers.DynamicCache(config=model.config)
            steps = [model(input_ids=ids[:, :17].to(dev), past_key_values=cache, use_cache=True).logits]
            for t in range(17, 21):
                steps.append(model(input_ids=ids[:, t:t + 1].to(dev), past_key_values=cache, use_cache=True).logits)
    except tileattn.Error as e:
        skip_unsupported(e)
    ours = torch.cat(steps, dim=1).double().cpu()
    check_rule(ours, logits(ms["sdpa"], input_ids=ids), logits(ms["oracle"], input_ids=ids), DTYPE[device])


@pytest.mark.parametrize("device", DEVICES)
def test_sliding_window(seeded, device):
    config = transformers.MistralConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, sliding_window=6)
    ids = torch.randint(0, 128, (2, 31))
    compare_models(models(config, device, transformers.MistralForCausalLM), device, input_ids=ids)


def test_gradients_match_eager(seeded):
    config = llama_config()
    ms = models(config, "cpu")
    ids = torch.randint(0, 128, (2, 23))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0

    def grads(model):
        model.train().zero_grad()
        model(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()
        return {n: p.grad.double() for n, p in model.named_parameters() if "self_attn" in n}
    try:
        with backend("cpu", "backward"):
            ours = grads(ms["tileattn"])
    except tileattn.Error as e:
        skip_unsupported(e)
    baseline, oracle = grads(ms["sdpa"]), grads(ms["oracle"])
    for name in oracle:
        check_rule(ours[name], baseline[name], oracle[name], torch.float32)


def test_non_causal_module_attends_to_every_key(rng):
    q, k, v = (torch.from_numpy(rng.standard_normal((2, 4, 19, 16))).float() for _ in range(3))
    with backend("cpu"):
        out, weights = hf.attention_forward(SimpleNamespace(is_causal=False), q, k, v, None, scaling=0.3)
    want = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), scale=0.3)
    assert weights is None and out.shape == (2, 19, 4, 16)
    assert (out.double() - want.transpose(1, 2)).abs().max().item() < 1e-5


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_4d_mask_runs_block_sparse(rng, kind):
    """A caller's 4D mask (per batch and query row, here a causal mask with random holes, as
    transformers builds them: 0 and the dtype's lowest value) against SDPA with the same mask in
    float64, forward and backward, with grouped heads."""
    b, hq, hk, sq, d = 2, 4, 2, 150, 16
    q = torch.from_numpy(rng.standard_normal((b, hq, sq, d))).float().requires_grad_()
    k, v = (torch.from_numpy(rng.standard_normal((b, hk, sq, d))).float().requires_grad_() for _ in range(2))
    keep = torch.from_numpy(rng.random((b, 1, sq, sq)) < 0.7) & torch.ones(sq, sq, dtype=torch.bool).tril()
    keep |= torch.eye(sq, dtype=torch.bool)  # every row sees a key
    mask = keep if kind == "bool" else torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)
    with backend("cpu"):
        out, _ = hf.attention_forward(SimpleNamespace(is_causal=True), q, k, v, mask, scaling=0.25)
        g = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    ins = [x.detach().double().requires_grad_() for x in (q, k, v)]
    want = torch.nn.functional.scaled_dot_product_attention(*ins, attn_mask=keep, scale=0.25, enable_gqa=True)
    assert out.shape == (b, sq, hq, d)
    assert (out.double() - want.transpose(1, 2)).abs().max().item() < 1e-4
    for x, w in zip(g, torch.autograd.grad(want.transpose(1, 2), ins, torch.ones(b, sq, hq, d, dtype=torch.float64))):
        assert (x.double() - w).abs().max().item() < 1e-4


def test_4d_mask_read_once_for_every_layer(rng, count_calls):
    """transformers passes one 4D mask to every layer: it is converted, checked and cut into blocks in the
    first layer only, and the layers' outputs are those of separate masks."""
    from tileattn import _dense_mask
    calls = count_calls({"visible": (hf, "_visible"), "lists": (_dense_mask, "_block_lists")})
    b, h, sq, d = 2, 2, 150, 16
    keep = torch.from_numpy(rng.random((b, 1, sq, sq)) < 0.7) & torch.ones(sq, sq, dtype=torch.bool).tril()
    mask = torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)
    layers = [[torch.from_numpy(rng.standard_normal((b, h, sq, d))).float() for _ in range(3)] for _ in range(3)]
    with backend("cpu"):
        outs = [hf.attention_forward(SimpleNamespace(is_causal=True), *x, mask, scaling=0.25)[0] for x in layers]
        alone = [hf.attention_forward(SimpleNamespace(is_causal=True), *x, mask.clone(), scaling=0.25)[0]
                 for x in layers]
    assert calls == {"visible": 4, "lists": 4}  # the shared mask once, each clone once
    for x, y in zip(outs, alone):
        assert torch.equal(x, y)


def test_refusals():
    q = torch.randn(1, 2, 8, 16)
    module = SimpleNamespace(is_causal=True)
    with pytest.raises(ValueError, match=r"attention_mask has shape \(1, 8, 8\)"):
        hf.attention_forward(module, q, q, q, torch.zeros(1, 8, 8))
    with pytest.raises(ValueError, match="finite additive biases"):
        hf.attention_forward(module, q, q, q, torch.full((1, 1, 8, 8), -2.0))
    with pytest.raises(NotImplementedError, match="softcap"):
        hf.attention_forward(module, q, q, q, torch.zeros(1, 1, 8, 8), softcap=30.0)
    with pytest.raises(NotImplementedError, match="s_aux"):
        hf.attention_forward(module, q, q, q, None, s_aux=torch.zeros(2))
    with pytest.raises(NotImplementedError, match="output_attentions"):
        hf.attention_forward(module, q, q, q, None, output_attentions=True)


def test_mask_builder_never_materializes():
    mask = torch.ones(3, 10, dtype=torch.bool)
    assert hf.mask_builder(3, 10, 10, attention_mask=None) is None
    assert hf.mask_builder(3, 10, 10, attention_mask=mask) is None
    mask[1, 0] = False
    assert torch.equal(hf.mask_builder(3, 10, 10, attention_mask=mask), mask)
    # A window of 6 keys (positions 4..9) for 4 queries (positions 6..9) skips the padding.
    assert hf.mask_builder(3, 4, 6, q_offset=6, kv_offset=4, attention_mask=mask) is None
    mask[2, 7] = False
    assert torch.equal(hf.mask_builder(3, 4, 6, q_offset=6, kv_offset=4, attention_mask=mask), mask[:, -6:])


def test_mask_builder_cuts_a_static_cache_to_its_tokens():
    """A static cache of 16 slots holding 7 tokens, 2 of them new: the mask covers the 7 slots in use."""
    m = hf.mask_builder(2, 2, 16, q_offset=torch.tensor(5), kv_offset=0, attention_mask=None)
    assert m.shape == (2, 7) and m.stride() == (0, 0) and bool(m.all())
    pad = torch.ones(2, 7, dtype=torch.bool)
    pad[0, :3] = False
    assert torch.equal(hf.mask_builder(2, 2, 16, q_offset=torch.tensor(5), kv_offset=0, attention_mask=pad), pad)


def _generate(model, ids, mask, cache_implementation, new=8):
    dev = next(model.parameters()).device
    kw = dict(max_new_tokens=new, do_sample=False, pad_token_id=0)
    if cache_implementation != "dynamic":
        kw["cache_implementation"] = cache_implementation
    with torch.no_grad():
        return model.generate(input_ids=ids.to(dev), attention_mask=mask.to(dev), **kw).cpu()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("arch", ["llama", "mistral-sliding"])
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
def test_generate_matches_sdpa(seeded, device, cache, arch, padded):
    """generate() token for token against sdpa on the same weights: dynamic and static caches, sliding-window
    layers (a window shorter than the prompt plus the new tokens), left-padded batches."""
    if arch == "llama":
        config, cls = llama_config(), transformers.LlamaForCausalLM
    else:
        config = transformers.MistralConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                            sliding_window=7, max_position_embeddings=256)
        cls = transformers.MistralForCausalLM
    ms = models(config, device, cls)
    ids = torch.randint(1, 128, (3, 11))
    mask = torch.ones_like(ids)
    if padded:
        mask[0, :4] = 0
        mask[2, :1] = 0
        ids = ids.masked_fill(mask == 0, 0)
    try:
        with backend(device, "decode"), backend(device):
            ours = _generate(ms["tileattn"], ids, mask, cache)
    except tileattn.Error as e:
        skip_unsupported(e)
    want = _generate(ms["sdpa"], ids, mask, cache)
    if torch.equal(ours, want):
        return
    # In 16 bits on a GPU the two attentions round differently, so greedy decoding may take the other
    # side of a near tie; the first divergence must be one in the fp64 model's own logits.
    row, pos = next((r, p) for r in range(ours.shape[0]) for p in range(ours.shape[1]) if ours[r, p] != want[r, p])
    seen = torch.cat([mask, torch.ones(mask.shape[0], want.shape[1] - mask.shape[1], dtype=mask.dtype)], 1)
    with torch.no_grad():
        exact = ms["oracle"](input_ids=want[row:row + 1, :pos], attention_mask=seen[row:row + 1, :pos]).logits[0, -1]
    gap = (exact[want[row, pos]] - exact[ours[row, pos]]).abs().item()
    assert device != "cpu" and gap <= 0.02 * exact.abs().max().item(), \
        f"tileattn {ours[:, 11:].tolist()} vs sdpa {want[:, 11:].tolist()}: fp64 logit gap {gap:.3g} at row {row}, {pos}"
