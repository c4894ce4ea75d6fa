"""
A sharded run's checkpoints (train.py with fsdp=True): one folder per save, out_dir/ckpt_<iter>.dcp/, written by
every rank at once through torch.distributed.checkpoint (DCP) in safetensors: each rank's rows of every tensor in a
file of its own, their places in the file's JSON header, so that a load on any number of ranks takes the rows it
needs (DCP reshards). Beside them meta.json holds what ckpt.pt holds besides tensors. Nothing in the folder is
pickled, and nothing is unpickled to read it (DCP's own format pickles its index; this one does not).

    save(out_dir, iter_num, raw, optimizers, ema, meta, keep_every)   every rank, atomically: into a temp folder,
                                                                      renamed whole; older saves then go
    load(folder, raw, optimizers, ema) -> meta     every rank: model, optimizer states and EMA, resharded
    read(folder) -> checkpoint dict                one process: ckpt.pt's format (model, EMA; no optimizer states),
                                                   for sample.py, eval_ppl.py, eval_harness.py and export.py
    read_meta(folder), saves(out_dir), is_save(path)

A folder is whole once it has its name: the ranks write into .ckpt_<iter>.dcp.tmp.<pid>, and rank 0 renames it
after the last shard and meta.json are on disk (fsynced), so a kill mid-save leaves the previous save as it was.
Every rank must see the same out_dir (one node, or a filesystem the nodes share).
"""

if __name__ == '__main__':  # run as a script (python aogpt/sharded.py): one line, not an ImportError
    raise SystemExit("error: aogpt/sharded.py is a library module, with nothing to run: the commands are train.py, "
                     "sample.py, eval_ppl.py, eval_harness.py and export.py at the repository's root")

import contextlib
import json
import logging
import math
import os
import re
import shutil
import warnings

import torch
import torch.distributed as dist

from aogpt.errors import UserError, first_line
from aogpt.paths import _fsync_folder, atomic_json

FORMAT = 'aogpt-dcp-v1'
META = 'meta.json'
SAVE = re.compile(r'ckpt_(\d+)\.dcp')


def save_name(iter_num):
    return f'ckpt_{iter_num:07d}.dcp'


def is_save(path):
    """Is path a sharded save (a folder named ckpt_<iter>.dcp holding meta.json)?"""
    return os.path.isdir(path) and bool(SAVE.fullmatch(os.path.basename(os.path.normpath(path)))) and \
        os.path.isfile(os.path.join(path, META))


def saves(out_dir):
    """The whole sharded saves in out_dir, newest first (a temp folder of a killed save is not one)."""
    try:
        names = [f for f in os.listdir(out_dir) if SAVE.fullmatch(f)]
    except OSError:
        return []
    found = [os.path.join(out_dir, f) for f in names if os.path.isfile(os.path.join(out_dir, f, META))]
    return sorted(found, key=_iteration, reverse=True)


def _iteration(path):
    """The iteration a save's folder name gives (ckpt_<iter>.dcp)."""
    return int(SAVE.fullmatch(os.path.basename(path)).group(1))


def _tensors(raw, optimizers, ema):
    """What a save holds besides meta.json, by name: the model's weights, the optimizer states (by parameter name,
    through torch's state-dict helpers, which also allocate a fresh optimizer's state for a load to fill) and the
    EMA, each a DTensor's rows or a replicated tensor."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    osd = get_optimizer_state_dict(raw, optimizers)
    model = get_model_state_dict(raw)
    if raw.config.tie_head:  # one weight under two names: safetensors keeps it once, as wte (exports do the same)
        model.pop('lm_head.weight')
    state = {'model': model, 'optim': osd['state']}
    if ema is not None:
        state['ema'] = ema.params
    return state, osd


def save(out_dir, iter_num, raw, optimizers, ema, meta, keep_every=0):
    """Every rank: write this save as out_dir/ckpt_<iter>.dcp, then drop the older saves but those kept (iteration a
    multiple of keep_every). meta: the checkpoint's non-tensor parts (JSON), written by rank 0. A failed write raises
    OSError on every rank, the temp folder gone and the previous saves as they were. Returns the folder."""
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    from torch.distributed.checkpoint import save as dcp_save
    rank = dist.get_rank()
    final = os.path.join(out_dir, save_name(iter_num))
    pid = torch.tensor(os.getpid())
    dist.broadcast(pid, 0)  # the ranks write into rank 0's temp folder
    tmp = os.path.join(out_dir, f'.{save_name(iter_num)}.tmp.{int(pid)}')
    _on_rank0(lambda: (shutil.rmtree(tmp, ignore_errors=True), os.makedirs(tmp)))
    state, _ = _tensors(raw, optimizers, ema)
    try:
        with _quiet():
            dcp_save(state, storage_writer=HuggingFaceStorageWriter(tmp, save_distributed=True))
    except _failed() as e:  # DCP gathers the ranks' failures into one CheckpointException, raised on every rank
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise OSError(f"the sharded save failed ({first_line(e, 200)})") from e
    dist.barrier()  # every shard on disk: rank 0 gives the folder its name
    _on_rank0(lambda: _publish(tmp, final, dict(meta, format=FORMAT, iter_num=iter_num,
                                                world_size=dist.get_world_size()), keep_every))
    return final


def _on_rank0(work):
    """work() on rank 0, then every rank learns whether it worked: an OSError there is raised on every rank (none
    is left waiting in a collective for a rank that failed)."""
    error = None
    if dist.get_rank() == 0:
        try:
            work()
        except OSError as e:
            error = e
        except _failed() as e:  # the written shards' index unreadable: a failed write all the same
            error = OSError(f"the sharded save could not be read back ({first_line(e, 200)})")
    ok = torch.tensor(int(error is None))
    dist.broadcast(ok, 0)
    if not ok:
        raise error if error is not None else OSError("rank 0 could not write the sharded checkpoint")


def _publish(tmp, final, meta, keep_every):
    """Rank 0: meta.json into the temp folder, with every tensor's whole shape as the shards just written hold it
    (what a load checks the shards still cover), the folder renamed whole to its name, then the older saves dropped
    but those kept. A save of the same iteration (an eval_only rerun) is moved aside first and put back on failure."""
    out_dir = os.path.dirname(final)
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    index = HuggingFaceStorageReader(tmp).read_metadata().state_dict_metadata
    atomic_json(os.path.join(tmp, META), dict(meta, tensors={k: list(v.size) for k, v in index.items()}))
    _fsync_folder(tmp)
    old = os.path.join(out_dir, f'.{os.path.basename(final)}.old.{os.getpid()}') if os.path.exists(final) else None
    if old:
        os.rename(final, old)
    try:
        os.rename(tmp, final)
    except OSError:
        if old:
            os.rename(old, final)
        raise
    _fsync_folder(out_dir)
    for p in saves(out_dir)[1:]:
        if not (keep_every and _iteration(p) % keep_every == 0):
            shutil.rmtree(p, ignore_errors=True)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def clean(out_dir, name):
    """What a killed save leaves in out_dir under name: its temp folder goes; a save it had moved aside goes if its
    replacement has the name, else it gets the name back."""
    path = os.path.join(out_dir, name)
    head, sep, _ = name[1:].rpartition('.old.')
    if sep and not os.path.exists(os.path.join(out_dir, head)):
        os.rename(path, os.path.join(out_dir, head))
    else:
        shutil.rmtree(path, ignore_errors=True)


def read_meta(folder):
    """A save's meta.json (a UserError for a folder that is not one of ours)."""
    path = os.path.join(folder, META)
    try:
        with open(path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {path} ({first_line(e)}): {folder} is not a whole sharded checkpoint")
    if not isinstance(meta, dict) or meta.get('format') != FORMAT:
        raise UserError(f"{path} is not a train.py sharded checkpoint's (format {FORMAT!r})")
    return meta


def _index(folder, meta):
    """The save's index of tensors (DCP's metadata, read from the shards' JSON headers), checked against meta.json:
    every tensor it recorded is there at its whole shape, and its shards cover all of it. A shard file lost, cut or
    from another save is one line, never a tensor assembled with rows missing."""
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    try:
        with _quiet():
            index = HuggingFaceStorageReader(folder).read_metadata().state_dict_metadata
    except _failed() as e:
        raise UserError(f"cannot read the sharded checkpoint {folder} ({first_line(e, 300)}): a shard file is "
                        f"truncated or not safetensors; use another save")
    for key, shape in meta.get('tensors', {}).items():
        got = index.get(key)
        held = sum(math.prod(c.sizes) for c in got.chunks) if got is not None else 0
        if got is None or list(got.size) != shape or held != math.prod(shape):
            raise UserError(f"the sharded checkpoint {folder} lacks rows of {key} (its shards hold {held:,} of "
                            f"{math.prod(shape):,} values): a shard file is missing or from another save; use "
                            f"another save")
    return index


def _load(state, folder):
    """DCP's load of state (tensors allocated, filled in place) from folder's safetensors: what fails is one line."""
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from torch.distributed.checkpoint import load as dcp_load
    try:
        with _quiet():
            dcp_load(state, storage_reader=HuggingFaceStorageReader(folder))
    except _failed() as e:
        raise UserError(f"cannot read the sharded checkpoint {folder} ({first_line(e, 300)}): a shard is missing, "
                        f"truncated or of another model; use another save, or resume from an earlier one")


def _failed():
    """What a DCP call raises when it fails: its own CheckpointException is a BaseException, so it is named (imported
    only when an exception is matched: DCP takes most of a second to import, which no command should pay)."""
    from torch.distributed.checkpoint.api import CheckpointException
    return Exception, CheckpointException


@contextlib.contextmanager
def _quiet():
    """DCP logs its failures with their tracebacks on the root logger, and warns that one process means no process
    group: what fails is said once, in our line."""
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings('ignore', message='torch.distributed is disabled')
            yield
    finally:
        logging.disable(logging.NOTSET)


def load(folder, raw, optimizers, ema):
    """Every rank: put a save's weights, optimizer states and EMA into the run's (sharded or not: DCP takes each rank's
    rows of every tensor, whatever the world size that wrote it). The optimizers keep their configured settings (lr,
    weight_decay, ...: what the resuming config says), as resume_state does for ckpt.pt. Returns meta.json."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                         set_optimizer_state_dict)
    meta = read_meta(folder)
    _index(folder, meta)
    state, osd = _tensors(raw, optimizers, ema)
    if ema is None or meta.get('ema') is None:  # an EMA the save lacks starts from the resumed weights
        state.pop('ema', None)
    _load(state, folder)
    set_model_state_dict(raw, state['model'], options=StateDictOptions(strict=not raw.config.tie_head))
    set_optimizer_state_dict(raw, optimizers, dict(osd, state=state['optim']))
    if ema is not None and 'ema' not in state:
        ema.params = {n: p.detach().clone().float() for n, p in ema.live.items()}
    return meta


def read(folder):
    """A save as ckpt.pt's dict, in one process (no process group): its meta.json's keys, and 'model' and 'ema' as
    whole tensors assembled from every rank's rows. The optimizer states are not read."""
    meta = read_meta(folder)
    index = _index(folder, meta)
    state = {k: torch.empty(v.size, dtype=v.properties.dtype) for k, v in index.items()
             if k.startswith(('model.', 'ema.'))}
    _load(state, folder)
    ckpt = {k: v for k, v in meta.items() if k not in ('ema', 'order')}
    model = {k[6:]: v for k, v in state.items() if k.startswith('model.')}
    if meta['model_args'].get('tie_head'):
        model['lm_head.weight'] = model['transformer.wte.weight']
    ckpt.update(format='aogpt-v1', sharded=folder, model=model,
                order=None if meta.get('order') is None else torch.tensor(meta['order']))
    if meta.get('ema') is not None:
        ckpt['ema'] = dict(meta['ema'], params={k[4:]: v for k, v in state.items() if k.startswith('ema.')})
    return ckpt
