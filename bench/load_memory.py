"""
A rank's peak host memory while it loads a source folder into the model train.py adapts (cond='adaln'): the
unsharded path (one process: families.hf_source, then model.adapt, as train.py without fsdp) against FSDP's
(torchrun, fsdp=True: the model built on the meta device, sharded, each rank reading only its rows of the files and
drawing the new table as one process would: parallel.build). The folder is a Llama-shaped one written here with
random bfloat16 weights (no download), its size set by --n_layer and --n_embd.

Memory is the process's anonymous resident memory (RssAnon in /proc/self/status, sampled every 5 ms while it loads),
less what it held before: the tensors it made. The safetensors files are memory-mapped, so the pages a rank reads
also show as file-backed memory (RssFile: the page cache, which the kernel can drop); that peak is printed beside.

    python bench/load_memory.py                         # ~0.5B parameters, 2 ranks
    python bench/load_memory.py --n_layer=4 --world=2   # a quick look
    python bench/load_memory.py --write=True            # and append the table to BENCHMARKS.md
"""
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

from aogpt.configurator import configure, print_config  # noqa: E402
from aogpt.errors import exit_in_one_line  # noqa: E402
from bench.common import append_benchmark, check_settings  # noqa: E402

n_layer = 16          # the source's shape: a Llama with these blocks ...
n_embd = 1536         # ... this width (12 heads of 128, 4 key/value heads), an MLP of 8/3 the width
vocab_size = 32000
world = 2             # FSDP ranks (torchrun --nproc_per_node)
folder = ''           # an existing source folder instead of writing one
write = False         # append the table to BENCHMARKS.md
mode = ''             # (internal: 'whole' or 'sharded', the measured load in a process of its own)
exit_in_one_line()
cfg = configure(globals())
if not mode:
    print_config(cfg)
check_settings(cfg, at_least=dict(n_layer=1, n_embd=128, vocab_size=64, world=1), one_of=dict(mode=('', 'whole',
                                                                                                  'sharded')))


def write_source(path):
    """A Llama folder of random bfloat16 weights: config.json and model.safetensors, as transformers saves them."""
    from safetensors.torch import save_file
    heads, kv, hidden = n_embd // 128, max(1, n_embd // 512), (8 * n_embd // 3 + 127) // 128 * 128
    config = dict(model_type='llama', vocab_size=vocab_size, hidden_size=n_embd, num_hidden_layers=n_layer,
                  num_attention_heads=heads, num_key_value_heads=kv, intermediate_size=hidden,
                  max_position_embeddings=4096, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
                  tie_word_embeddings=False, hidden_act='silu', rope_theta=10000.0)
    g = torch.Generator().manual_seed(0)
    t = lambda *shape: (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)  # noqa: E731
    sd = {'model.embed_tokens.weight': t(vocab_size, n_embd), 'model.norm.weight': t(n_embd) + 1,
          'lm_head.weight': t(vocab_size, n_embd)}
    for i in range(n_layer):
        m = f'model.layers.{i}.'
        sd.update({m + 'input_layernorm.weight': t(n_embd) + 1, m + 'post_attention_layernorm.weight': t(n_embd) + 1,
                   m + 'self_attn.q_proj.weight': t(n_embd, n_embd), m + 'self_attn.k_proj.weight': t(kv * 128, n_embd),
                   m + 'self_attn.v_proj.weight': t(kv * 128, n_embd), m + 'self_attn.o_proj.weight': t(n_embd, n_embd),
                   m + 'mlp.gate_proj.weight': t(hidden, n_embd), m + 'mlp.up_proj.weight': t(hidden, n_embd),
                   m + 'mlp.down_proj.weight': t(n_embd, hidden)})
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, 'config.json'), 'w') as f:
        json.dump(config, f)
    save_file(sd, os.path.join(path, 'model.safetensors'))
    return sum(v.numel() for v in sd.values())


class Peak:
    """The largest RssAnon and RssFile (bytes) of this process while running, sampled every 5 ms."""

    def __init__(self):
        self.anon = self.file = 0
        self.running = True
        self.thread = threading.Thread(target=self._sample, daemon=True)

    @staticmethod
    def now():
        fields = dict(line.split(':', 1) for line in open('/proc/self/status'))
        return (int(fields[k].split()[0]) * 1024 for k in ('RssAnon', 'RssFile'))

    def _sample(self):
        while self.running:
            anon, file = self.now()
            self.anon, self.file = max(self.anon, anon), max(self.file, file)
            time.sleep(0.005)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *a):
        self.running = False
        self.thread.join()


def load():
    """This process's load (mode), measured: its peak memory over what it held before, and its seconds."""
    import safetensors.torch  # noqa: F401 (every module the load imports, before the baseline: not counted)
    import torch.distributed.checkpoint.state_dict  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    import torch.distributed.tensor  # noqa: F401

    from aogpt import parallel
    from aogpt.families import hf_source, source_rows
    from model import adapt, adapted_config
    torch.manual_seed(1337)
    if mode == 'sharded':
        import torch.distributed as dist
        dist.init_process_group('gloo')
    base_anon, base_file = Peak.now()
    t0 = time.time()
    with Peak() as peak:
        if mode == 'whole':
            src, _ = hf_source(folder)
            model = adapt(src, 'adaln', target_dim=128, target_std=0.02)
            del src
        else:
            config, _, rows = source_rows(folder, hash_files=False)
            args = dict(vars(adapted_config(config, 'adaln', target_dim=128, target_std=0.02)))
            model, _ = parallel.build(args, rows, 'cpu', fsdp=True)
        held = parallel.local_bytes(model)['weights']
    out = dict(rank=int(os.environ.get('RANK', 0)), anon=peak.anon - base_anon, file=peak.file - base_file,
               held=held, seconds=time.time() - t0)
    print('RESULT ' + json.dumps(out), flush=True)
    if mode == 'sharded':
        dist.destroy_process_group()


if mode:
    load()
    sys.exit(0)

tmp = None
if not folder:
    tmp = tempfile.TemporaryDirectory(prefix='aogpt-load-memory-')
    folder = os.path.join(tmp.name, 'llama')
    print(f"writing a random Llama source ({n_layer} blocks, width {n_embd}) to {folder} ...")
    write_source(folder)
file_bytes = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder) if f.endswith('.safetensors'))
env = dict(os.environ, OMP_NUM_THREADS='1')
me = os.path.abspath(__file__)
runs = [('one process, unsharded', [sys.executable, me, f'--folder={folder}', '--mode=whole']),
        (f'FSDP, {world} ranks', [sys.executable, '-m', 'torch.distributed.run', '--standalone',
                                  f'--nproc_per_node={world}', me, f'--folder={folder}', '--mode=sharded'])]
rows = []
for name, cmd in runs:
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise SystemExit(f"error: the {name} load failed:\n{p.stderr[-2000:]}")
    for r in sorted((json.loads(line[7:]) for line in p.stdout.splitlines() if line.startswith('RESULT ')),
                    key=lambda r: r['rank']):
        rows.append(f"| {name} | {r['rank']} | {r['held'] / 1e9:.2f} | {r['anon'] / 1e9:.2f} | {r['file'] / 1e9:.2f} | "
                    f"{r['seconds']:.1f} |")
GB = 1e9
table = ("| load | rank | weights held (GB, float32) | peak anonymous memory (GB) | peak file-backed (GB) | seconds |\n"
         "|---|---|---|---|---|---|\n" + "\n".join(rows))
description = (f"A random Llama source of {n_layer} blocks, width {n_embd}, vocabulary {vocab_size} "
               f"({file_bytes / GB:.2f} GB of bfloat16 safetensors), adapted into AO-GPT (cond='adaln'). Peak memory "
               f"is over what the process held before loading.")
print(description)
print(table)
if write:
    append_benchmark('A rank\'s host memory while loading a source', False, description, table)
if tmp is not None:
    tmp.cleanup()
