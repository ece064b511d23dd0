"""Read back what an offline W&B run wrote: its ``run-<id>.wandb`` transaction log, the
file ``wandb sync`` uploads. wandb 0.31 ships no Python reader for it (the writer is
wandb-core, in Go), so this decodes the documented container here: a 7-byte header
(``:W&B``, magic, version), then 32 KiB blocks of chunks, each a 7-byte header (CRC,
length, type: full, first, middle, last) and its bytes; a block's last < 7 bytes are
padding. Each complete record is wandb's own protobuf ``Record``."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

import wandb
from wandb.proto import wandb_internal_pb2

HEADER = struct.Struct("<4sHB")
CHUNK = struct.Struct("<IHB")
BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


@dataclass
class OfflineRun:
    """One offline run: its identity, config, history rows (by ``_step``) and summary."""

    project: str = ""
    group: str = ""
    name: str = ""
    config: dict = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    exit_code: int | None = None


def records(path: Path) -> list[wandb_internal_pb2.Record]:
    data = path.read_bytes()
    ident, magic, version = HEADER.unpack_from(data)
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), (ident, magic, version)
    out, pending, pos = [], b"", HEADER.size
    while pos + CHUNK.size <= len(data):
        if BLOCK - pos % BLOCK < CHUNK.size:  # padding at the end of a block
            pos += BLOCK - pos % BLOCK
            continue
        _, length, kind = CHUNK.unpack_from(data, pos)
        if kind == 0:
            break  # zeros: the end of what was written
        pending += data[pos + CHUNK.size : pos + CHUNK.size + length]
        pos += CHUNK.size + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


def _key(item) -> str:
    return "/".join(item.nested_key) if item.nested_key else item.key


def read_offline_run(run_dir: Path) -> OfflineRun:
    """``run_dir``: a ``wandb/offline-run-*`` directory."""
    (log,) = run_dir.glob("run-*.wandb")
    run = OfflineRun()
    for record in records(log):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.project, run.group, run.name = record.run.project, record.run.run_group, record.run.display_name
            run.config.update({_key(item): json.loads(item.value_json) for item in record.run.config.update})
        elif kind == "config":
            run.config.update({_key(item): json.loads(item.value_json) for item in record.config.update})
        elif kind == "history":
            run.history.append({_key(item): json.loads(item.value_json) for item in record.history.item})
        elif kind == "summary":
            run.summary.update({_key(item): json.loads(item.value_json) for item in record.summary.update})
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
    return run


def offline_runs(wandb_dir: Path) -> dict[str, OfflineRun]:
    """Every offline run under ``wandb_dir`` (``WANDB_DIR``), by run name.

    W&B's service process (wandb-core) writes the transaction logs; ``run.finish()`` can
    return before it has flushed them, and a busy machine showed it (a log still empty
    when read). Shutting the service down first makes it write everything out."""
    wandb.teardown()
    runs = [read_offline_run(path) for path in sorted(wandb_dir.glob("wandb/offline-run-*"))]
    return {run.name: run for run in runs}
