"""A small randomly initialized Llama-style model run with attn_implementation="tileattn" and "sdpa":
the logits are compared and a forward+backward training step of each is timed.

    python examples/hf_llama.py [--layers 4] [--batch 2] [--seqlen 1024] [--device cuda|cpu] [--backend auto]

Needs PyTorch and transformers; downloads nothing (the model is built from a LlamaConfig). On a GPU it
runs in bf16, on a CPU in fp32. The backward step needs the backend's backward pass; where the backend
does not have one yet, the forward comparison still runs and the step reports why it was skipped.
"""

import argparse
import copy
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import tileattn
import tileattn.integrations.transformers as tileattn_hf


def build(config, implementation, state, device, dtype):
    # A model keeps (and its attn_implementation rewrites) the config it is given: one copy each.
    model = LlamaForCausalLM._from_config(copy.deepcopy(config), attn_implementation=implementation, dtype=dtype)
    model.load_state_dict(state)
    return model.to(device).train()


def step_ms(step, device):
    """Wall time of one step() in milliseconds, synchronized on CUDA."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def compare(models, ids, device, repeats):
    with torch.no_grad():
        logits = {name: m(input_ids=ids).logits.float() for name, m in models.items()}
    diff = (logits["tileattn"] - logits["sdpa"]).abs().max().item()
    print(f"logits max abs diff tileattn vs sdpa: {diff:.3e} (logits max abs {logits['sdpa'].abs().max().item():.2f})")

    def training_step(model):
        def step():
            model.zero_grad(set_to_none=True)
            model(input_ids=ids, labels=ids).loss.backward()
        return step

    steps, times = {}, {}
    for name, model in models.items():
        try:  # one warm-up call each; a backend without a backward pass says so, the other model still runs
            step_ms(training_step(model), device)
        except Exception as e:
            print(f"{name:>8}: forward+backward step skipped: {e}")
            continue
        steps[name], times[name] = training_step(model), []
    # The models take turns, so that neither gains from running second (warm caches, clocks).
    for _ in range(repeats):
        for name, step in steps.items():
            times[name].append(step_ms(step, device))
    for name, ms in times.items():
        print(f"{name:>8}: forward+backward step {statistics.median(ms):8.2f} ms")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seqlen", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--backend", default="auto", help="tileattn backend: auto, cuda, cpu_flash, cpu_reference")
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if device.type == "cpu":
        args.seqlen = min(args.seqlen, 256)  # keeps the CPU run to seconds

    tileattn_hf.register()
    # Llama-style with grouped-query attention (8 query heads share 2 KV heads), head dim 64.
    config = LlamaConfig(vocab_size=4096, hidden_size=512, intermediate_size=1376, num_hidden_layers=args.layers,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=args.seqlen,
                         attention_dropout=0.0)
    torch.manual_seed(0)
    state = LlamaForCausalLM(config).state_dict()  # one set of random weights for both models
    models = {name: build(config, name, state, device, dtype) for name in ("tileattn", "sdpa")}
    ids = torch.randint(0, config.vocab_size, (args.batch, args.seqlen), device=device)
    print(f"tileattn {tileattn.__version__}, torch {torch.__version__}, device {device}, dtype {dtype}, "
          f"{args.layers} layers, batch {args.batch}, seqlen {args.seqlen}")

    with tileattn.use_backend(args.backend):
        compare(models, ids, device, args.repeats)


if __name__ == "__main__":
    main()
