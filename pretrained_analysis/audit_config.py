"""How to audit: ``AuditConfig``, validated where it is made."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from sinkscope.infra.arguments import check_argument
from sinkscope.infra.bounds import COUNT, EPS, POSITIVE, SEED, TOKENS, Bound, check_bounds
from sinkscope.infra.errors import InputError
from sinkscope.pretrained_analysis.ablation import ABLATE_SINKS
from sinkscope.pretrained_analysis.audit_experiments import check_experiments
from sinkscope.probes.probe import ProbeConfig

MIN_BOOTSTRAP = 20  # resamples: fewer cannot place a 95% interval's 2.5% tails


@dataclass(frozen=True)
class AuditConfig:
    """How to audit. sink_eps: a sink head has anchor mass >= 1 - sink_eps; ablate: the
    loss-based ablations (causal models); ablate_heads: how many sink heads, strongest
    anchor mass first, are ablated one by one (all of them are ablated together either
    way; each tested set costs four passes with logits: sink removal, its control, the
    zero- and the mean-ablation; two with head_ablations off); ablate_prompts: ablate on the
    first this many prompts only (None: all); ablate_sink: the sink removed, ``anchor``
    (the sink heads' anchor key) or ``learned`` (the learned sink logits of heads whose
    learned sink takes >= 1 - sink_eps, gpt-oss); n_examples: prompts drawn as attention
    heatmaps; n_bootstrap: resamples for the ablations' intervals; seed: their control keys;
    layers: the layers probed (None: all), where the sink heads and ablated heads come from;
    key_geometry / secondary_sinks: measure them in the same pass (``ProbeConfig``);
    input_types, eps_curve, lengths: the sink experiments (``input_types``; None: not run);
    input_protocol: how their inputs are built, ``sinkscope`` (each prompt's own length, its
    anchor kept first) or ``gu`` (Gu et al.'s: 64 tokens, no BOS prepended)."""

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "batch_size": POSITIVE,
        "sink_eps": EPS,
        "ablate_heads": COUNT,
        "ablate_prompts": POSITIVE,
        "n_examples": COUNT,
        "n_bootstrap": POSITIVE,
        "seed": SEED,
        "layers": COUNT,
        "eps_curve": EPS,
        "lengths": TOKENS,
    }

    batch_size: int = 16
    sink_eps: float = 0.1
    ablate: bool = False
    ablate_heads: int = 16
    ablate_prompts: int | None = None
    ablate_sink: str = "anchor"
    head_ablations: bool = True  # zero- and mean-ablate each tested set beside its sink removal
    n_examples: int = 2
    n_bootstrap: int = 1000
    seed: int = 0
    layers: tuple[int, ...] | None = None
    key_geometry: bool = True
    secondary_sinks: bool = True
    input_types: tuple[str, ...] | None = None
    eps_curve: tuple[float, ...] | None = None
    lengths: tuple[int, ...] | None = None
    input_protocol: str = "sinkscope"

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", ProbeConfig(layers=self.layers).layers)  # sorted, checked
        for name in ("input_types", "eps_curve", "lengths"):  # a list from Python reads as its tuple
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        check_experiments(self.input_types, self.eps_curve, self.lengths, self.input_protocol)
        if self.eps_curve is not None:  # a curve is drawn in eps order, each eps once (as lengths)
            object.__setattr__(self, "eps_curve", tuple(sorted(set(self.eps_curve))))
        for name in ("batch_size", "ablate_heads", "n_examples", "n_bootstrap", "seed"):
            check_argument(getattr(self, name), int, name, "an integer")
        check_argument(self.ablate_prompts, (int, type(None)), "ablate_prompts", "an integer or None")
        check_argument(self.sink_eps, (float, int), "sink_eps", "a number in [0, 1)")
        for name in ("ablate", "head_ablations", "key_geometry", "secondary_sinks"):
            check_argument(getattr(self, name), bool, name, "True or False")
        if self.ablate_sink not in ABLATE_SINKS:
            raise InputError(
                f"ablate_sink must be one of {', '.join(ABLATE_SINKS)}, got {self.ablate_sink!r}", field="ablate_sink"
            )
        if self.ablate_sink != "anchor" and not self.ablate:
            raise InputError(
                f"ablate_sink {self.ablate_sink!r} says which sink the ablations remove; turn them on with ablate "
                "(--ablate)",
                field="ablate_sink",
            )
        if self.ablate_heads < 0:
            raise InputError(f"ablate_heads must be >= 0, got {self.ablate_heads}", field="ablate_heads")
        if self.ablate_prompts is not None and self.ablate_prompts < 1:
            raise InputError(f"ablate_prompts must be >= 1, got {self.ablate_prompts}", field="ablate_prompts")
        if self.batch_size < 1:
            raise InputError(f"batch_size must be >= 1, got {self.batch_size}", field="batch_size")
        if not 0.0 <= self.sink_eps < 1.0:
            raise InputError(f"sink_eps must lie in [0, 1), got {self.sink_eps}", field="sink_eps")
        if self.n_examples < 0:
            raise InputError(f"n_examples must be >= 0, got {self.n_examples}", field="n_examples")
        if self.n_bootstrap < MIN_BOOTSTRAP:
            raise InputError(
                f"n_bootstrap must be >= {MIN_BOOTSTRAP} for a 95% interval, got {self.n_bootstrap}",
                field="n_bootstrap",
            )
        if self.seed < 0:  # the experiments' bootstrap and the random inputs draw from it
            raise InputError(f"seed must be >= 0, got {self.seed}", field="seed")
        check_bounds(self)  # the rest of BOUNDS: what audit.json's reader accepts, e.g. counts within 64 bits

    def restricted_layers(self, n_layers: int) -> tuple[int, ...] | None:
        """The layers probed, where ``layers`` leaves some of the model's ``n_layers`` out."""
        return None if self.layers is None or len(self.layers) == n_layers else self.layers

    def probe_config(self) -> ProbeConfig:
        return ProbeConfig(
            sink_eps=self.sink_eps,
            batch_size=self.batch_size,
            layers=self.layers,
            with_key_geometry=self.key_geometry,
            with_secondary_sinks=self.secondary_sinks,
        )
