"""K toy models that differ only in their seed, trained as one stack: the weights stacked
(``torch.func.stack_module_state``) and run with ``vmap``, one Adam stepping them all, and
each member leaving the stack when it converges, reaches ``max_steps`` or diverges.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence

import torch
from jaxtyping import Float
from torch.func import functional_call, stack_module_state, vmap

from sinkscope.infra.heartbeat import progress_bar
from sinkscope.toy.checkpoint import save_tensors
from sinkscope.toy.device_stop import DeviceStop, Stopped, device_step
from sinkscope.toy.interrupt import StepBoundaryInterrupt
from sinkscope.toy.run_dir import (
    FINAL_WEIGHTS,
    RESULT_FILE,
    TrainResult,
    write_train_result,
)
from sinkscope.toy.run_integrity import file_sha256
from sinkscope.toy.run_member import RunMember, log_step, paper_adam, write_step_checkpoint
from sinkscope.toy.task import TaskBatch, sample_batch

# on_log(step, record): ``record`` is the line just written to one run's metrics.jsonl
# (step, loss, linf_error, anchor_mass_default, anchor_mass_trigger) with ``run`` added,
# ``str(Path(run_dir))``: the members of a stack log the same steps, and the directory is
# what tells them apart (and what a caller already holds for each run).
OnLog = Callable[[int, dict], None]


class SeedStack:
    """The active members' weights and the Adam that steps them. One member: its own
    model and Adam, unchanged (the single-model numbers exactly). Several: weights
    stacked ``{name: [K, ...]}`` and run with ``vmap``."""

    def __init__(self, members: list[RunMember]) -> None:
        self.members = members
        self.names = [name for name, _ in members[0].model.named_parameters()]
        if len(members) == 1:
            only = members[0]
            self.optimizer = only.optimizer
            self._model = only.model
            return
        self.base = copy.deepcopy(members[0].model).to("meta")
        params, self.buffers = stack_module_state([m.model for m in members])
        self.params = {name: params[name] for name in self.names}
        self.optimizer = paper_adam(list(self.params.values()), members[0].config)
        self._load_member_optimizer_states()
        self._batched = vmap(lambda p, b, x: functional_call(self.base, (p, b), (x,)))

    def parameters(self) -> list[torch.Tensor]:
        """The tensors Adam steps: the model's own (one member) or the stacked ones."""
        if len(self.members) == 1:
            return list(self._model.parameters())
        return list(self.params.values())

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens [K, batch, pos, d_model]`` -> outputs of the same shape."""
        if len(self.members) == 1:
            return self._model(tokens[0]).unsqueeze(0)
        return self._batched(self.params, self.buffers, tokens)

    def functional_forward(
        self, weights: Sequence[torch.Tensor], tokens: Float[torch.Tensor, "k batch pos d_model"]
    ) -> Float[torch.Tensor, "k batch pos d_model"]:
        """``forward`` with ``weights`` (in ``parameters()`` order) in place of the stack's
        own, which it leaves untouched: what ``torch.func`` differentiates."""
        named = dict(zip(self.names, weights))
        if len(self.members) == 1:
            return functional_call(self._model, named, (tokens[0],)).unsqueeze(0)
        return self._batched(named, self.buffers, tokens)

    def _load_member_optimizer_states(self) -> None:
        """Stack the members' Adam states (all at the same step) into the stack's Adam."""
        states = [m.optimizer.state_dict()["state"] for m in self.members]
        if not states[0]:
            return
        for index, name in enumerate(self.names):
            self.optimizer.state[self.params[name]] = {
                "step": states[0][index]["step"].clone(),
                "exp_avg": torch.stack([s[index]["exp_avg"] for s in states]),
                "exp_avg_sq": torch.stack([s[index]["exp_avg_sq"] for s in states]),
            }

    def sync_member(self, k: int) -> None:
        """Copy slice ``k`` of the stacked weights and Adam state into member k's own model
        and Adam, so checkpoints and metrics use the single-model code paths (a no-op for
        one member: its model is the stack)."""
        if len(self.members) == 1:
            return
        member = self.members[k]
        with torch.no_grad():
            for name, param in member.model.named_parameters():
                param.copy_(self.params[name][k])
                state = self.optimizer.state.get(self.params[name])
                if state:
                    member.optimizer.state[param] = {
                        "step": state["step"].clone(),
                        "exp_avg": state["exp_avg"][k].clone(),
                        "exp_avg_sq": state["exp_avg_sq"][k].clone(),
                    }

    def without(self, drop: set[int]) -> SeedStack | None:
        keep = [k for k in range(len(self.members)) if k not in drop]
        if not keep:
            return None
        for k in keep:
            self.sync_member(k)
        return SeedStack([self.members[k] for k in keep])


class StackTraining:
    """One ``train_stack`` call under way: the stack of members still training, the step
    they are at, the last step checkpointed, the results so far, the progress bar and
    the caller's ``on_log``."""

    def __init__(
        self, members: list[RunMember], progress: bool, on_log: OnLog | None, device_rule: bool, compiled: bool
    ) -> None:
        self.members = members
        self.device_rule, self.compiled = device_rule, compiled
        self.stepping: tuple[SeedStack, DeviceStop, Callable] | None = None
        self.progress = progress
        self.on_log = on_log
        self.step = members[0].step
        self.train_cfg, self.task_cfg = members[0].config.train, members[0].config.task
        self.target = members[0].config.model.target
        self.stack: SeedStack | None = SeedStack(members)
        self.results: dict[int, TrainResult] = {}
        self.index_of = {id(m): k for k, m in enumerate(members)}
        self.started = time.perf_counter()
        self.last_checkpoint = self.step if self.step > 0 else -1
        label = members[0].location.name if len(members) == 1 else f"{len(members)} seeds"
        self.bar = progress_bar(self.train_cfg.max_steps, label, progress, initial=self.step)

    def elapsed(self, member: RunMember) -> float:
        """``member``'s training time: before this call and since it started."""
        return member.wall_before + time.perf_counter() - self.started

    def advance(self, interrupt: StepBoundaryInterrupt) -> bool:
        """With the device-side stop rule: the steps up to the next one that logs,
        checkpoints or ends the run, with no host read, then that step on the host. Without
        it: one step on the host. False when no member continues."""
        if self.device_rule:
            self._device_block(interrupt)
            if self.stack is None:
                return False
        return self.train_step(interrupt)

    def _device_block(self, interrupt: StepBoundaryInterrupt) -> None:
        """Steps on the device until the next host step (or an interrupt); then one read of
        the stop flags, and the members that stopped finish at their own stop step."""
        stack = self.stack
        assert stack is not None
        end = next_host_step(self.step, self.train_cfg.log_every, self.train_cfg.checkpoint_every)
        end = min(end, self.train_cfg.max_steps)
        if end <= self.step or not stack.optimizer.state:  # Adam's state is made by its first step
            return
        if self.stepping is None or self.stepping[0] is not stack:
            stop = DeviceStop(len(stack.members), self.train_cfg.stop_linf, stack.parameters()[0].device)
            self.stepping = (
                stack,
                stop,
                device_step(
                    stack.forward, stack.functional_forward, stack.parameters(), stack.optimizer, stop, self.compiled
                ),
            )
        _, stop, step_once = self.stepping
        start, start_states = self.step, [m.generator.get_state() for m in stack.members]
        stop.step.fill_(start)
        while self.step < end and not interrupt.requested:
            _, tokens, targets = self._draw_batches()
            step_once(tokens, targets)
            self.step += 1
        self.bar.update(self.step - start)
        stops = stop.stopped_members()
        for stopped in stops:
            self._finish_stopped(stopped, start, start_states[stopped.index])
        if stops:
            self.stack = stack.without({stopped.index for stopped in stops})

    def _finish_stopped(self, stopped: Stopped, start: int, start_state: torch.Tensor) -> None:
        """A member the device stopped at ``stopped.step``: its log line and finish, as the
        host would have written them then (its batch and data state drawn again)."""
        assert self.stack is not None
        member = self.stack.members[stopped.index]
        generator = torch.Generator(device=member.generator.device).set_state(start_state)
        for _ in range(stopped.step - start):
            sample_batch(self.task_cfg, self.train_cfg.batch_size, generator, self.target)
        data_state = generator.get_state()
        batch = sample_batch(self.task_cfg, self.train_cfg.batch_size, generator, self.target)
        status = "diverged" if stopped.diverged else "converged"
        if not stopped.diverged:
            self.stack.sync_member(stopped.index)
            self._log(member, stopped.step, stopped.loss, stopped.linf, batch)
        self._finish(stopped.index, status, stopped.loss, stopped.linf, data_state, stopped.step)

    def train_step(self, interrupt: StepBoundaryInterrupt) -> bool:
        """One step of every member of the stack; False when none continues."""
        stack, train_cfg = self.stack, self.train_cfg
        assert stack is not None  # called only while members are training
        data_states = [m.generator.get_state() for m in stack.members]
        if interrupt.requested:  # between steps: each member's state is one step's, consistent
            self._checkpoint_all(data_states)
            raise KeyboardInterrupt
        batches, tokens, targets = self._draw_batches()
        error = stack.forward(tokens) - targets
        losses = error.pow(2).mean(dim=(1, 2, 3))  # [K]
        linfs = error.detach().abs().amax(dim=(1, 2, 3))
        loss_values, linf_values = losses.detach().tolist(), linfs.tolist()
        finished = self._record(batches, data_states, loss_values, linf_values)
        if self.step % train_cfg.checkpoint_every == 0:
            self.last_checkpoint = self.step
        continuing = [k for k in range(len(stack.members)) if k not in finished]
        if not continuing:
            return False
        if self.progress and self.step % train_cfg.log_every == 0:
            self.bar.set_postfix_str(
                f"{len(continuing)} training, best L-inf {min(linf_values[k] for k in continuing):.1e} "
                f"(stops below {train_cfg.stop_linf:g})",
                refresh=False,
            )
        stack.optimizer.zero_grad(set_to_none=True)
        (losses if len(continuing) == len(losses) else losses[continuing]).sum().backward()
        stack.optimizer.step()
        self.step += 1
        self.bar.update(1)
        if finished:
            self.stack = stack.without(finished)
        return True

    def _checkpoint_all(self, data_states: list[torch.Tensor]) -> None:
        """Checkpoint every member at the current step (unless this step already is)."""
        assert self.stack is not None
        if self.step != self.last_checkpoint:
            for k, member in enumerate(self.stack.members):
                self.stack.sync_member(k)
                write_step_checkpoint(member, self.step, data_states[k], self.elapsed(member))

    def _draw_batches(self) -> tuple[list[TaskBatch], torch.Tensor, torch.Tensor]:
        """Each member's next batch from its own generator, and their tokens and targets
        stacked ``[K, batch, pos, d_model]``."""
        assert self.stack is not None
        batches = [
            sample_batch(self.task_cfg, self.train_cfg.batch_size, m.generator, self.target) for m in self.stack.members
        ]
        if len(batches) == 1:  # a view, not a copy: K = 1 costs what a plain training step does
            return batches, batches[0].tokens.unsqueeze(0), batches[0].targets.unsqueeze(0)
        return batches, torch.stack([b.tokens for b in batches]), torch.stack([b.targets for b in batches])

    def _record(
        self,
        batches: list[TaskBatch],
        data_states: list[torch.Tensor],
        loss_values: list[float],
        linf_values: list[float],
    ) -> set[int]:
        """Per member, this step's checkpoint, log line and finish (diverged, converged or
        at ``max_steps``); the stack indices of the members that finished."""
        assert self.stack is not None
        step, train_cfg = self.step, self.train_cfg
        finished: set[int] = set()
        for k, member in enumerate(self.stack.members):
            loss_k, linf_k = loss_values[k], linf_values[k]
            if not (math.isfinite(loss_k) and math.isfinite(linf_k)):
                self._finish(k, "diverged", loss_k, linf_k, data_states[k])
                finished.add(k)
                continue
            # checkpoint only states whose loss is known to be finite, so the "last good
            # checkpoint" named on divergence really is good
            if step % train_cfg.checkpoint_every == 0 and step != self.last_checkpoint:
                self.stack.sync_member(k)
                write_step_checkpoint(member, step, data_states[k], self.elapsed(member))
            converged = linf_k < train_cfg.stop_linf
            if step % train_cfg.log_every == 0 or converged or step >= train_cfg.max_steps:
                self.stack.sync_member(k)
                self._log(member, step, loss_k, linf_k, batches[k])
            if converged or step >= train_cfg.max_steps:
                self._finish(k, "converged" if converged else "max_steps", loss_k, linf_k, data_states[k])
                finished.add(k)
        return finished

    def _log(self, member: RunMember, step: int, loss: float, linf: float, batch: TaskBatch) -> None:
        record = log_step(member, step, loss, linf, batch)
        if self.on_log is not None:
            threads = torch.get_num_threads()
            self.on_log(step, {**record, "run": str(member.location)})
            # a callback may change torch's thread count; on some CPUs 2 threads sum in
            # another order than 1, so the trainer's own count holds for its steps
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)

    def _finish(
        self, k: int, status: str, loss: float, linf: float, data_state: torch.Tensor, step: int | None = None
    ) -> None:
        """Write member k's final checkpoint and weights (unless it diverged) and its result,
        at ``step`` (default: the step being taken; earlier for a member the device
        stopped, whose weights and Adam moments are frozen since, and whose Adam step count
        is wound back to that step's)."""
        assert self.stack is not None  # called for members of the stack being stepped
        member = self.stack.members[k]
        self.stack.sync_member(k)
        step = self.step if step is None else step
        rewind_adam_count(member.optimizer, self.step - step)
        # a run continued past an earlier finish still holds that finish's result and
        # weights: the stale result goes first, so a kill in between leaves an unfinished
        # run (resumable), never a result describing other weights
        (member.run_dir / RESULT_FILE).unlink(missing_ok=True)
        if status != "diverged":
            if step != self.last_checkpoint:
                write_step_checkpoint(member, step, data_state, self.elapsed(member))
            save_tensors(member.run_dir / FINAL_WEIGHTS, member.model.state_dict())
        else:
            (member.run_dir / FINAL_WEIGHTS).unlink(missing_ok=True)  # the last good checkpoint speaks for it
        result = TrainResult(
            str(member.location),
            status,
            status == "converged",
            step,
            self.elapsed(member),
            linf,
            loss,
            member.resumed_from,
            # readers check the final weights against it: a swapped file is not this result
            None if status == "diverged" else file_sha256(member.run_dir / FINAL_WEIGHTS),
        )
        write_train_result(member.run_dir, result)
        self.results[self.index_of[id(member)]] = result


def next_host_step(step: int, log_every: int, checkpoint_every: int) -> int:
    """The first step from ``step`` on that logs or checkpoints."""
    return min(-(-step // every) * every for every in (log_every, checkpoint_every))


def rewind_adam_count(optimizer: torch.optim.Optimizer, steps: int) -> None:
    """Adam's step count as it was ``steps`` steps ago (its moments are frozen already)."""
    if steps:
        for state in optimizer.state.values():
            state["step"] = state["step"] - steps


def train_stack(
    members: list[RunMember],
    progress: bool,
    on_log: OnLog | None,
    interrupt: StepBoundaryInterrupt,
    device_rule: bool = False,
    compiled: bool = False,
) -> list[TrainResult]:
    """Train members that start at the same step until each converges, reaches
    ``max_steps`` or diverges; one result per member. ``device_rule``: the stop rule kept
    on the device, the host reading it only at the steps that log or checkpoint (same
    numbers; no synchronisation per step on a GPU). ``compiled``: those steps compiled
    (``sinkscope.toy.compiled_step``); needs ``device_rule``."""
    training = StackTraining(members, progress, on_log, device_rule or compiled, compiled)
    try:
        while training.stack is not None:
            if not training.advance(interrupt):
                break
    finally:
        training.bar.close()
    return [training.results[k] for k in range(len(members))]
