"""The flags of `sinkscope audit`, by group: prompts and layers, prompt sources, the
ablations, and where the models load and run."""

from __future__ import annotations

import argparse

from sinkscope.cli.args import (
    NON_NEGATIVE,
    POSITIVE,
    add_executor,
    add_layers,
    device_name,
    fraction,
    out_path,
    prompt_text,
    within,
)


def add_prompt_flags(audit: argparse.ArgumentParser) -> None:
    """The prompts, from a source or typed, and the layers probed."""
    audit.add_argument(
        "--prompts",
        dest="source",
        metavar="SOURCE",
        default=None,
        help="default (built-in English prompts), random (random tokens), a .txt (one prompt per "
        "line)/.jsonl/.csv/.parquet file, or a Hugging Face dataset ID[:CONFIG] (default: default); for text "
        "typed on the command line, use --prompt",
    )
    audit.add_argument(
        "--prompt",
        dest="prompt_texts",
        metavar="TEXT",
        action="append",
        type=prompt_text,
        default=None,
        help="one prompt, typed here (repeatable: each --prompt is one prompt, all are used); instead of "
        "--prompts, and for one model on the local executor (several models: put the prompts in a .txt file)",
    )
    add_layers(audit, "the sink heads, and the heads the ablations remove, come from these layers")


def add_input_flags(audit: argparse.ArgumentParser) -> None:
    """The prompts, where results go, and how the prompts are cut and batched."""
    from sinkscope.pretrained_analysis.prompts import DEFAULT_MAX_LEN, DEFAULT_N_PROMPTS, PromptSpec

    audit.add_argument(
        "--out",
        type=out_path,
        dest="out_dir",
        default=None,
        help="output directory (default sinkscope-out/audit/<model>); refused if it exists and is not "
        "empty, unless --overwrite",
    )
    audit.add_argument(
        "--revision",
        action="append",
        default=None,
        help="hub revision, e.g. a Pythia checkpoint step1000 (repeatable: a checkpoint sweep)",
    )
    audit.add_argument(
        "--max-len",
        type=within(PromptSpec.BOUNDS["max_len"]),
        default=DEFAULT_MAX_LEN,
        help=f"T: most tokens per prompt, BOS included; longer prompts are truncated (default {DEFAULT_MAX_LEN})",
    )
    audit.add_argument(
        "--n-prompts",
        type=within(PromptSpec.BOUNDS["n_prompts"]),
        default=DEFAULT_N_PROMPTS,
        help=f"number of prompts; a seeded subset when the source holds more (default {DEFAULT_N_PROMPTS})",
    )
    audit.add_argument(
        "--seed",
        type=within(PromptSpec.BOUNDS["seed"]),
        default=0,
        help="seed for random prompts, subsets and ablation controls",
    )
    audit.add_argument("--batch-size", type=POSITIVE, default=16, help="prompts per forward pass (default 16)")
    audit.add_argument(
        "--prepend-bos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="put the tokenizer's BOS ([CLS] for encoders) first; it is the anchor (default: yes)",
    )
    audit.add_argument(
        "--parse-special-tokens",
        action="store_true",
        help="read special-token text in prompts (e.g. <|endoftext|>) as special tokens; by default it is "
        "tokenized as the text it spells",
    )
    audit.add_argument("--text-column", default="text", help="text column of .jsonl/.csv/.parquet files and datasets")
    audit.add_argument(
        "--split", default="train", help="dataset split, slicing allowed, e.g. 'test[:500]' (default train)"
    )


def add_ablation_flags(audit: argparse.ArgumentParser) -> None:
    """The ablations, the sink-head threshold and the heatmap examples."""
    audit.add_argument(
        "--ablate",
        action="store_true",
        help="loss change when each sink head's sink is removed, all together, and the anchor evicted",
    )
    audit.add_argument(
        "--ablate-heads",
        type=NON_NEGATIVE,
        default=16,
        help="sink heads ablated one by one, strongest first; all are ablated together too (default 16)",
    )
    audit.add_argument(
        "--ablate-prompts",
        type=POSITIVE,
        default=None,
        help="run the ablations on the first N prompts only (default: all)",
    )
    audit.add_argument(
        "--ablate-sink",
        choices=("anchor", "learned"),
        default="anchor",
        help="the sink --ablate removes: the anchor key, or learned sink logits (gpt-oss) (default anchor)",
    )
    audit.add_argument(
        "--no-head-ablations",
        dest="head_ablations",
        action="store_false",
        help="with --ablate: skip the zero- and mean-ablation of each tested head set beside its sink removal "
        "(half the passes per set)",
    )
    audit.add_argument("--sink-eps", type=fraction, default=0.1, help="sink head: anchor mass >= 1 - eps (default 0.1)")
    audit.add_argument(
        "--examples",
        dest="n_examples",
        type=NON_NEGATIVE,
        default=2,
        help="prompts drawn as attention heatmaps (default 2)",
    )


def add_placement_flags(audit: argparse.ArgumentParser) -> None:
    """Where and how the models load and run: device, workers, executor, dtype, splitting."""
    from sinkscope.pretrained_analysis.loading import DTYPES, LoadSpec

    audit.add_argument(
        "--device",
        type=device_name,
        default=None,
        help="cpu, cuda, cuda:1, mps or auto (default: TransformerLens picks)",
    )
    audit.add_argument(
        "--workers",
        type=POSITIVE,
        default=1,
        help="with several models or revisions: audits at once (local processes, or the CPUs of a local Ray "
        "instance) (default 1)",
    )
    add_executor(audit)
    audit.add_argument(
        "--dtype",
        choices=DTYPES,
        default="float32",
        help="weights dtype; for GGUF files, the dtype they are dequantised to (default float32)",
    )
    audit.add_argument("--device-map", default=None, help="split a large model across devices, e.g. auto")
    audit.add_argument(
        "--n-devices",
        type=within(LoadSpec.BOUNDS["n_devices"]),
        default=None,
        help="split a large model across this many GPUs",
    )
    audit.add_argument("--overwrite", action="store_true", help="replace an existing, non-empty --out")
