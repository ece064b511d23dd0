"""`sinkscope audit`: pretrained models audited for attention sinks, one or several."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from pathlib import Path

from sinkscope.cli.args import (
    add_common_output,
    check_executor,
    say,
    units_bar,
)
from sinkscope.cli.audit_config import add_measurement_flags
from sinkscope.cli.audit_config import audit_config as _audit_config
from sinkscope.cli.audit_experiment_flags import add_experiment_flags
from sinkscope.cli.audit_flags import add_ablation_flags, add_input_flags, add_placement_flags, add_prompt_flags
from sinkscope.cli.inputs import INPUTS_NAME, CommandPaths, datasets_cache, existing_files, hub_cache, model_paths
from sinkscope.infra.codec import encode
from sinkscope.infra.errors import InputError
from sinkscope.reports.formatting import estimate_text, plural

EXAMPLES = """examples:
  sinkscope audit gpt2 --out sinkscope-out/audit/gpt2
  sinkscope audit gpt2 --prompts random --n-prompts 100 --ablate --out sinkscope-out/audit/gpt2-random
  sinkscope audit gpt2 --prompt "The cat sat on the mat." --prompt "Where did I put my keys?" --layers 0-3,11 \
      --out sinkscope-out/audit/gpt2-typed
  sinkscope audit gpt2 gpt2-medium distilgpt2 --prompts my_prompts.txt --out sinkscope-out/audit/gpt2-family
  sinkscope audit pythia-160m --revision step0 --revision step1000 --revision step143000 \\
      --out sinkscope-out/audit/pythia-160m-sweep
  sinkscope audit ./my-checkpoint --prompts data.csv --text-column body --no-prepend-bos --out out/mine
  sinkscope audit EleutherAI/pythia-1b --dtype bfloat16 --device-map auto \\
      --prompts Salesforce/wikitext:wikitext-2-raw-v1 --split "test[:2000]" --out out/pythia-1b
  sinkscope audit ./SmolLM2-135M-Instruct.Q4_1.gguf --ablate --ablate-prompts 16 --out out/smollm2

MODEL: a short name (gpt2, gpt2-medium, gpt2-large, gpt2-xl, distilgpt2, pythia-14m ... pythia-12b,
pythia-70m-deduped ...), a Hugging Face id (org/name), a directory written by save_pretrained, or
a GGUF file (or a directory holding exactly one; needs pip install 'sinkscope[gguf]').
Several models, or several --revision values of one model, also write comparison.json/.md and
plots. Offline (HF_HUB_OFFLINE=1), hub models must already be in the local Hugging Face cache.
"""


def add_parser(commands: argparse._SubParsersAction) -> None:
    audit = commands.add_parser(
        "audit",
        help="audit pretrained models (GPT-2, Pythia, any Hugging Face model) for attention sinks",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    audit.add_argument(
        "models",
        nargs="+",
        metavar="MODEL",
        help="short name, Hugging Face id, local directory, or a GGUF file (or a directory holding one)",
    )
    add_prompt_flags(audit)
    add_input_flags(audit)
    add_ablation_flags(audit)
    add_measurement_flags(audit)
    add_experiment_flags(audit)
    add_placement_flags(audit)
    add_common_output(audit)


def _check_prompt_flags(args: argparse.Namespace, n_audits: int) -> None:
    """``--prompt`` and ``--prompts`` are two ways to give the prompts: one of them, and
    typed prompts go to one local audit (a suite or a Ray unit reads its prompts from a
    source); a ``--prompts`` value that names no source reads as a typed prompt."""
    from sinkscope.pretrained_analysis.prompts import is_dataset_id, source_kind

    if args.prompt_texts and args.source is not None:
        raise InputError("--prompt and --prompts both give the prompts; pass one of them (--prompt is repeatable)")
    if args.prompt_texts and (n_audits > 1 or args.executor == "ray"):
        raise InputError(
            "--prompt is for one audit (one model, one revision) on the local executor; put the prompts in a .txt "
            "file, one per line, "
            "and pass --prompts FILE"
        )
    if getattr(args, "layers", None) is not None and n_audits > 1:
        raise InputError(
            "--layers restricts the audit of one model, and a comparison of several needs every layer; "
            "drop --layers, or audit each model alone"
        )
    if args.source is not None and source_kind(args.source) == "hub" and not is_dataset_id(args.source):
        raise InputError(
            f"--prompts {args.source!r} is no existing file, default, random or dataset id; if it is a file, check "
            f"its path; to audit it as a prompt, pass --prompt {shlex.quote(args.source)}"
        )


def _prompts(args: argparse.Namespace):
    """The prompts' spec and, for typed prompts (``--prompt``), their set already made."""
    from sinkscope.pretrained_analysis.prompts import PromptSpec, prompt_set

    if args.prompt_texts:
        typed = prompt_set(args.prompt_texts, args.max_len, args.prepend_bos, args.parse_special_tokens)
        typed = dataclasses.replace(typed, location=f"{plural(len(typed.texts), 'prompt')} typed with --prompt")
        return typed.spec, typed
    spec = PromptSpec(
        source=args.source or "default",
        max_len=args.max_len,
        n_prompts=args.n_prompts,
        seed=args.seed,
        prepend_bos=args.prepend_bos,
        text_column=args.text_column,
        split=args.split,
        parse_special_tokens=args.parse_special_tokens,
    )
    return spec, None


def paths(args: argparse.Namespace) -> CommandPaths:
    """The models (or the hub's cache) and the prompts (a file, or the datasets cache); the
    default output, under the current directory, is checked once the model is resolved."""
    from sinkscope.pretrained_analysis.prompts import source_kind

    source = args.source
    prompts = [datasets_cache()] if source is not None and source_kind(source) == "hub" else existing_files(source)
    return CommandPaths(Path(args.out_dir) if args.out_dir else None, (*model_paths(args.models), *prompts))


def run(args: argparse.Namespace) -> dict:
    from sinkscope.pretrained_analysis.loading import LoadSpec, context_length, resolve_model
    from sinkscope.pretrained_analysis.prompts import check_context, load_prompt_set

    revisions = args.revision or [None]
    if len(args.models) > 1 and len(revisions) > 1:
        raise InputError(
            "pass several models or several --revision values, not both (one --revision applies to every model)"
        )
    _check_prompt_flags(args, len(args.models) * len(revisions))
    check_executor(args)
    specs = [
        LoadSpec(name, revision, args.device, args.dtype, args.device_map, args.n_devices)
        for name in args.models
        for revision in revisions
    ]
    resolved = [resolve_model(spec.name, spec.revision) for spec in specs]
    prompt_spec, typed = _prompts(args)
    beyond = [length for length in args.lengths or () if length > prompt_spec.max_len]
    if beyond and args.input_protocol == "sinkscope":  # no prompt can reach them: refused before any model loads
        raise InputError(
            f"--lengths {','.join(map(str, beyond))} exceed --max-len {prompt_spec.max_len}, where prompts are cut; "
            f"use lengths <= {prompt_spec.max_len} or raise --max-len",
            field="lengths",
        )
    for where in resolved:
        if where.gguf_file and not args.no_progress:  # its metadata is read from the whole file: seconds
            print(f"reading {where.gguf_file}'s metadata ...", file=sys.stderr, flush=True)
        n_ctx = context_length(where)
        if n_ctx is not None:
            check_context(prompt_spec, n_ctx, where.label)
    # before torch and matplotlib load: a bad prompt file (or a HOME the datasets cache
    # cannot live in) fails in about a second, with nothing else said
    prompt_set = typed or load_prompt_set(prompt_spec)
    if not args.no_progress:  # seconds before any model loads; a bad prompt file has failed in one line already
        print(
            f"{plural(len(prompt_set.texts) or prompt_spec.n_prompts, 'prompt')} read; importing torch ...",
            file=sys.stderr,
            flush=True,
        )
    from sinkscope.pretrained_analysis.suite import unique_slugs

    slugs = unique_slugs([where.label for where in resolved])
    out = Path(args.out_dir or f"sinkscope-out/audit/{slugs[0]}{'-comparison' if len(specs) > 1 else ''}")
    # what the audit reads: a GGUF checkpoint is one file, so --out may sit beside it in its folder; a
    # hub model, the hub's cache; a prompt file (anything else is refused as prompts)
    inputs = [Path(where.location) / (where.gguf_file or "") for where in resolved if where.is_local]
    hub = [where.location for where in resolved if not where.is_local][:1]
    prompt_file = prompt_spec.source if prompt_spec.kind == "file" else None
    inputs += [*([hub_cache()] if hub else []), *existing_files(prompt_file)]
    if len(specs) > 1:
        return _audit_suite(args, out, specs, resolved, slugs, prompt_spec, inputs)
    from sinkscope.infra.atomic_io import claim_output_directory

    with claim_output_directory(out, args.overwrite, inputs, INPUTS_NAME, _own_places(args, out)):
        return _audit_one(args, out, specs[0], resolved[0], prompt_spec, prompt_set)


def _own_places(args: argparse.Namespace, out: Path) -> list[Path]:
    """The default output (under the current directory) is the audit's own, even when the
    current directory is the model's (``sinkscope audit .``); an --out given is checked."""
    return [] if args.out_dir else [out]


def _audit_line(result) -> str:
    line = (
        f"{result.model.label}: {result.model.n_layers} layers x {result.model.heads_text}; sink rate "
        + ", ".join(f"{rate.percent:.1f}% (ε {rate.eps})" for rate in result.sink_rates)
        + f"; {plural(len(result.sink_heads()), 'sink head')} (anchor mass >= {1 - result.config.sink_eps:g})"
    )
    threshold = 1 - result.config.sink_eps
    learned = [h for h in result.probe.heads if h.null_mass >= threshold]  # NaN (none measured) compares False
    if learned:  # gpt-oss: a sink on no key, which only --ablate-sink learned removes
        removed = result.ablation is not None and result.ablation.sink == "learned"
        line += f"; {plural(len(learned), 'head')} with a learned sink >= {threshold:g}" + (
            "" if removed else " (not ablated)"
        )
    if result.config.layers is not None:  # the counts above cover these layers only
        from sinkscope.probes.probe import layers_text

        line += f" in layers {layers_text(result.config.layers)} only"
    if result.ablation is not None:
        ablation = result.ablation
        increase, n = ablation.evict_anchor_increase, ablation.default_state.n_inputs
        change = (
            f"{ablation.evict_anchor_delta:+.3f}"
            if increase is None
            else estimate_text(ablation.evict_anchor_delta, increase.ci_low, increase.ci_high, n)
        )
        line += f"; loss {ablation.base_loss:.3f}, anchor evicted {change}"
        together = ablation.default_state.all_sink_heads
        if ablation.sink == "learned" and together is not None:
            line += f", learned sinks removed {together.error_after_remove - together.error_before:+.3f}"
    return line


def _audit_one(args: argparse.Namespace, out: Path, spec, resolved, prompt_spec, prompt_set) -> dict:
    """One model into ``out``, once it is checked and locked, on ``prompt_set`` (read already)."""
    from sinkscope.infra.atomic_io import atomic_directory
    from sinkscope.pretrained_analysis.loading import load_model, loading_announced

    progress = not args.no_progress
    if args.executor == "ray":  # one unit, written by the Ray worker (out must be on a disk the node shares)
        from sinkscope.execution import run_units, units_failed
        from sinkscope.pretrained_analysis.suite import unit_of

        unit = unit_of(_absolute(spec, resolved), _absolute_prompts(prompt_spec), _audit_config(args), out.resolve())
        report = run_units([unit], "ray", 1, args.ray_address)
        if report.failed:
            raise units_failed(report.failed, 1, "audit")
        (result,) = report.finished.values()
    else:
        with loading_announced(resolved.label, progress):
            from sinkscope.pretrained_analysis.audit import audit, write_audit

            loaded = load_model(spec, resolved, progress=progress)
        with atomic_directory(out, replace=args.overwrite) as tmp:
            if progress:
                print(f"auditing {resolved.label}: tokenizing, then probing ...", file=sys.stderr, flush=True)
            result = audit(loaded, prompt_set, _audit_config(args), progress=progress)
            del loaded
            if progress:
                print(f"drawing the figures and writing {out} ...", file=sys.stderr, flush=True)
            write_audit(result, tmp)
    if not args.json:
        say(_audit_line(result))
        if result.experiments is not None:  # asked for by flag: each gets its sentence here too
            from sinkscope.probes.sink_curve_tables import curve_findings

            for sentence in curve_findings(result.experiments):
                say(f"  {sentence}")
        say(f"wrote {out / 'audit.json'} and figures; `sinkscope report {out}` writes its report")
    return encode(result)


def _audit_suite(
    args: argparse.Namespace, out: Path, specs: list, resolved: list, slugs: tuple[str, ...], prompt_spec, inputs
) -> dict:
    """Several models or revisions: one unit each, resumable (``sinkscope.pretrained_analysis.suite``);
    the prompts were read once already, so a bad prompt file failed before any unit."""
    from sinkscope.infra.atomic_io import refuse_output_directory
    from sinkscope.pretrained_analysis.suite import AuditSuite, audit_suite

    # overwriting out would delete an input
    refuse_output_directory(out, True, inputs, INPUTS_NAME, _own_places(args, out))
    suite = AuditSuite(
        tuple(_absolute(spec, where) for spec, where in zip(specs, resolved)),
        slugs,
        _absolute_prompts(prompt_spec),
        _audit_config(args),
    )
    bar = units_bar(len(specs), "audits", not args.no_progress)
    if not args.json:
        bar.write(f"{len(specs)} audits into {out}: " + ", ".join(slugs))

    def done(result) -> None:
        bar.update(1)
        if not args.json:
            bar.write(_audit_line(result))

    with bar:
        comparison = audit_suite(suite, out, args.overwrite, done, args.executor, args.workers, args.ray_address)
    if not args.json:
        say(comparison.to_markdown())
        say(f"wrote {out / 'comparison.md'}, {out / 'comparison.json'} and one audit directory per model")
    return {"out": str(out), "comparison": encode(comparison)}


def _absolute(spec, where):
    """A local model by its absolute path (a unit may run in another working directory)."""
    if not where.is_local:
        return spec
    location = Path(where.location) / where.gguf_file if where.gguf_file else Path(where.location)
    return dataclasses.replace(spec, name=str(location))


def _absolute_prompts(prompt_spec):
    if prompt_spec.kind != "file":
        return prompt_spec
    return dataclasses.replace(prompt_spec, source=str(Path(prompt_spec.source).expanduser().resolve()))
