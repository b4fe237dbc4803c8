"""transformers models before and after rmsnorm.torch.replace, on one thread.

    python benchmarks/hf_models.py                 # every model, float32 and bfloat16
    python benchmarks/hf_models.py --models llama gemma3 --dtypes bfloat16
    python benchmarks/hf_models.py --accuracy      # the logits' errors instead of times

Each model is built from a config with random weights (nothing is
downloaded): small enough to time in seconds, with a hidden size of 1024 and
128-wide attention heads, so that its norms run at a real model's row
length. For each model and dtype it times a whole forward of a batch of
4x128 tokens, the original model against a copy with its norms replaced,
and each norm call, on the input that norm saw in that forward, the
original module against the replaced one (and, for a strided input, the
replaced one on a contiguous copy made first). Medians of interleaved samples
after a warm-up, under torch.no_grad(), with torch and rmsnorm on one
thread each; for the forward, also the median of the ratios of samples
taken in pairs, which a shared machine's drifting load moves less. It
prints markdown tables: the whole forward, then the norms.

With --accuracy it compares logits instead, with the norms' weights drawn
at random around the factor 1 (at their initial ones, Llama's weight
multiply would be exact): in float32, replaced against original; in
bfloat16, each against the float64 run of the original model, the largest
and the RMS error over the batch's logits.

Needs the torch and hf extras: pip install -e ".[torch,hf]".
"""

from __future__ import annotations

import argparse
import copy
import datetime
import statistics
import warnings

import torch
import transformers
from bench import cpu_model, interleaved_medians, other_load, sample_seconds

import rmsnorm
import rmsnorm.torch

SIZES = dict(
    hidden_size=1024,
    intermediate_size=2816,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=128,
    vocab_size=2048,
)
# name -> (config class, model class)
MODELS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "gemma": ("GemmaConfig", "GemmaForCausalLM"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
}
BATCH, TOKENS = 4, 128


def build(name: str, dtype: torch.dtype):
    config_class, model_class = MODELS[name]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**SIZES)
    return getattr(transformers, model_class)(config).eval().to(dtype)


def norm_inputs(model, ids) -> dict:
    """{norm kind: (module name, the input it saw)}: the first module of each kind
    (model.norm, input_layernorm, q_norm, ...), on the inputs of one forward."""
    seen, hooks = {}, []
    for module_name, module in model.named_modules():
        if type(module).__name__.endswith("RMSNorm"):
            kind = module_name.rsplit(".", 1)[-1]

            def record(module, args, kind=kind, module_name=module_name):
                seen.setdefault(kind, (module_name, args[0].detach().clone()))

            hooks.append(module.register_forward_pre_hook(record))
    model(ids)
    for hook in hooks:
        hook.remove()
    return seen


def accuracy(names) -> None:
    ids = token_ids()
    print(f"`python benchmarks/hf_models.py --accuracy`, {datetime.date.today().isoformat()}, "
          f"batch {BATCH}x{TOKENS} tokens, hidden {SIZES['hidden_size']}; logits' errors\n")
    print("| model | float32: replaced vs original, max | bfloat16 vs float64, max: transformers "
          "| rmsnorm | bfloat16 vs float64, RMS: transformers | rmsnorm |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in names:
        model = build(name, torch.float32)
        generator = torch.Generator().manual_seed(2)
        for module in model.modules():
            if type(module).__name__.endswith("RMSNorm"):
                # 1 + weight for Gemma's family: the same factors either way
                factor_one = 0.0 if "Gemma" in type(module).__name__ else 1.0
                spread = torch.randn(module.weight.shape, generator=generator)
                module.weight.copy_(factor_one + 0.25 * spread)
        replaced = copy.deepcopy(model)
        rmsnorm.torch.replace(replaced)
        float32 = (replaced(ids).logits - model(ids).logits).abs().max().item()
        reference = copy.deepcopy(model).double()(ids).logits
        errors = [
            (m.to(torch.bfloat16)(ids).logits.double() - reference).abs()
            for m in (model, replaced)
        ]
        worst = [f"{e.max().item():.4f}" for e in errors]
        rms = [f"{e.square().mean().sqrt().item():.5f}" for e in errors]
        print(f"| {name} | {float32:.1e} | {worst[0]} | {worst[1]} | {rms[0]} | {rms[1]} |")


def token_ids() -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, SIZES["vocab_size"], (BATCH, TOKENS), generator=generator)


def paired_times(before, after, repeats: int, min_seconds: float):
    """Median seconds of each, and the median of the ratios of samples taken
    one right after the other: on a shared machine the load drifts between
    samples, less within a pair."""
    for fn in (before, after):
        sample_seconds(fn, min_seconds)  # warm-up
    pairs = [(sample_seconds(before, min_seconds), sample_seconds(after, min_seconds))
             for _ in range(repeats)]
    return (statistics.median(b for b, _ in pairs), statistics.median(a for _, a in pairs),
            statistics.median(b / a for b, a in pairs))


def layout(x: torch.Tensor) -> str:
    return "x".join(map(str, x.shape)) + ("" if x.is_contiguous() else ", strided")


def microseconds(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} us" if seconds < 1e-2 else f"{seconds * 1e3:.1f} ms"


def speedup(before: float, after: float) -> str:
    ratio = before / after
    return f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--dtypes", nargs="+", choices=["float32", "bfloat16"],
                        default=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=7, help="samples per median")
    parser.add_argument("--accuracy", action="store_true", help="the logits' errors, not times")
    args = parser.parse_args()

    torch.set_num_threads(1)
    rmsnorm.set_num_threads(1)
    warnings.filterwarnings("ignore", module="transformers")
    if args.accuracy:
        with torch.no_grad():
            accuracy(args.models)
        return
    ids = token_ids()
    forward_rows, norm_rows, loads = [], [], []
    with torch.no_grad():
        for name in args.models:
            for dtype_name in args.dtypes:
                dtype = getattr(torch, dtype_name)
                before = build(name, dtype)
                after = copy.deepcopy(before)
                replaced = rmsnorm.torch.replace(after)

                def forward(model):
                    return lambda: model(ids, use_cache=False)

                times, load = other_load(
                    paired_times, forward(before), forward(after), 2 * args.repeats, 0.1
                )
                loads.append(load)
                forward_rows.append((name, dtype_name, replaced, *times))
                after_modules = dict(after.named_modules())
                for kind, (module_name, x) in norm_inputs(before, ids).items():
                    original, ours = before.get_submodule(module_name), after_modules[module_name]
                    candidates = {"before": lambda: original(x), "after": lambda: ours(x)}
                    if not x.is_contiguous():  # what a copy first would cost instead
                        candidates["copied"] = lambda: ours(x.contiguous())
                    norm_times = interleaved_medians(candidates, args.repeats, 0.05)
                    copied = norm_times.get("copied")
                    norm_rows.append((name, dtype_name, kind, layout(x), norm_times["before"],
                                      norm_times["after"], copied))

    print(f"`python benchmarks/hf_models.py`, {datetime.date.today().isoformat()}, {cpu_model()}, "
          f"1 thread, batch {BATCH}x{TOKENS} tokens, hidden {SIZES['hidden_size']}, "
          f"{SIZES['num_hidden_layers']} layers; other processes kept "
          f"{max(loads):.2f} CPUs busy at most\n")
    print("| model | dtype | norms replaced | forward before | forward after "
          "| after vs before (median of paired ratios) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, dtype_name, replaced, before_s, after_s, ratio in forward_rows:
        print(f"| {name} | {dtype_name} | {replaced} | {microseconds(before_s)} | "
              f"{microseconds(after_s)} | {speedup(ratio, 1.0)} |")
    print()
    print("| model | dtype | norm | input | before | after | after vs before "
          "| after, on a contiguous copy |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, dtype_name, kind, shape, before_s, after_s, copied_s in norm_rows:
        copied = "" if copied_s is None else microseconds(copied_s)
        print(f"| {name} | {dtype_name} | {kind} | {shape} | {microseconds(before_s)} | "
              f"{microseconds(after_s)} | {speedup(before_s, after_s)} | {copied} |")


if __name__ == "__main__":
    main()
