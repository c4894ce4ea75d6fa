"""
The sampling engine: the KV caches (KVCache, shared by the batch; RowCache, kept per sample) and how one
forward call of a sampler runs. The samplers (generate.py, speculative.py) decide what goes into a call;
this file decides how it runs:

  'dynamic'     at the call's own shape: r rows attending over the L cached slots and themselves
  'static'      at a few fixed shapes: rows padded up to two sizes per octave, every row attending over
                a span of the cache (L + rows rounded up to KV_BUCKET slots) under a mask built on the
                device from the call's scalars, so that no shape depends on L
  'cuda_graph'  'static', with each (rows, span) shape captured once as a CUDA graph and replayed

The samples are the same in every mode, up to float rounding (tests/test_sample.py checks the logits call
for call). Why the fixed shapes exist: a forward call of a deep model at a few rows per sample is
launch-bound on a GPU, and every new shape pays kernel setup; a replayed graph pays neither
(BENCHMARKS.md, "Sampling speed", has the measurements and the counted floors).

  cache = KVCache(model, B)               one layout for every mode
  step = SlotStepper(model, B, mode)      decoders: step(tok, pos, tgt, k) -> logits (B, k, V) of the
  step.cache.keep(rows)                   last k rows; the sampler then commits what the cache keeps
  step = RowStepper(model, B, mode, S)    per-sample commits (speculative.py): a RowCache of S slots, every
  step.cache.commit(keep)                 sample keeping its own rows (keep (B, r)) under its own mask
  enc = EncoderStepper(model, B, n, mode) the encoder MDM: enc(x) -> final-norm hidden states (B, n, C)
"""

if __name__ == '__main__':  # run as a script (python aogpt/engine.py): one line, not an ImportError
    raise SystemExit("error: aogpt/engine.py is a library module, with nothing to run: the commands are train.py, "
                     "sample.py, eval_ppl.py, eval_harness.py and export.py at the repository's root")

import torch

from model import parallel_mask

STEPPERS = ('dynamic', 'static', 'cuda_graph')
KV_BUCKET = 128  # fixed-shape calls attend over the cache up to a multiple of this many slots


class KVCache:
    """The sampler's K/V: per layer a (B, nh, S, hd) buffer for the keys and one for the values,
    preallocated and written in place. One layout for every mode, and nothing set on it before a call:
    the model's attention calls update(layer, input_pos, k, v, span) with where this call's rows go and
    how many slots it attends over (gpt-fast's update(input_pos, k, v), plus the span).

    `len` counts the committed slots. A call writes its rows from slot len on, and keep(j) then commits
    the first j of them; the rest (the throw-away parallel copies, padding) are overwritten by the next
    call. S = n_slots, by default slots(block_size): one scratch slot past block_size, where the padding
    rows of a fixed-shape call write, rounded up to a multiple of 16 (SDPA's mask alignment). The
    buffers are zeroed: a fixed-shape call attends (masked) over slots no row wrote yet, and a NaN there
    would still poison the output through 0 * NaN.
    """

    @staticmethod
    def slots(block_size):
        return (block_size // 16 + 1) * 16

    def __init__(self, model, batch_size, n_slots=None):
        cfg = model.config
        S = self.slots(cfg.block_size) if n_slots is None else n_slots
        _, n_kv_head, head_dim = cfg.heads  # grouped-query attention caches its n_kv_head heads only
        self.shape = (batch_size, n_kv_head, S, head_dim)
        self.n_layer = cfg.n_layer
        self.k = self.v = None
        self.len = 0

    def allocate(self, device, dtype):
        self.k = [torch.zeros(self.shape, device=device, dtype=dtype) for _ in range(self.n_layer)]
        self.v = [torch.zeros(self.shape, device=device, dtype=dtype) for _ in range(self.n_layer)]

    def update(self, layer, input_pos, k, v, span):
        """Write one call's K/V (B, nh, r, hd) of a layer at the slots input_pos (r,); return the keys and
        values of the slots [0, span) the call attends over."""
        if self.k is None:  # allocated lazily, so that the dtype follows autocast
            self.allocate(k.device, k.dtype)
        K, V = self.k[layer], self.v[layer]
        K.index_copy_(2, input_pos, k.to(K.dtype))
        V.index_copy_(2, input_pos, v.to(V.dtype))
        return K[:, :, :span], V[:, :, :span]

    def keep(self, rows, chosen=None):
        """Commit the first `rows` rows of the last call; rows=None empties the cache for a new run (the
        slots are always written before a real row reads them). chosen (B,): the last kept row is not the
        call's row rows - 1 but, per sample, the parallel copy `chosen` places after it (the confidence
        orders keep whichever copy the model was surest of)."""
        if rows is None:
            self.len = 0
            return
        if chosen is not None:
            dst = self.len + rows - 1
            b = torch.arange(self.shape[0], device=chosen.device)
            for buf in self.k + self.v:
                buf[b, :, dst] = buf[b, :, dst + chosen]
        self.len += rows


class RowCache(KVCache):
    """A KVCache whose samples keep different slots (the speculative sampler's per-sample commits): the
    buffer stays rectangular, every call writes all samples' rows at [len, len + r), and `valid` (B, S)
    says which slots each sample attends to. Attention does not care where a key sits (positions enter
    through the slot embeddings), so a slot a sample did not keep is just masked out; room() moves each
    sample's kept slots to the front when the buffer runs out. scratch: the last slot is a fixed-shape
    call's padding rows' (SlotStepper), never a kept row's."""

    def __init__(self, model, batch_size, n_slots, device, scratch=False):
        super().__init__(model, batch_size, n_slots)
        self.valid = torch.zeros(batch_size, n_slots, dtype=torch.bool, device=device)
        self.limit = n_slots - scratch

    def keep(self, rows, chosen=None):
        if rows is None:  # a new run: no sample keeps anything
            self.valid.zero_()
        super().keep(rows, chosen)

    def mask(self, inner):
        """(B, 1, r, len + r) attention mask: each sample's kept slots, then `inner` (r, r) among the rows."""
        B, r, L = self.shape[0], inner.size(0), self.len
        return torch.cat([self.valid[:, None, :L].expand(B, r, L), inner.expand(B, r, r)], 2)[:, None]

    def commit(self, keep):
        """Keep the last call's row i for the samples where keep (B, r) is set; the buffer advances to the
        last row any sample keeps (the rows after it are overwritten by the next call)."""
        r = keep.size(1)
        self.valid[:, self.len:self.len + r] = keep
        cols = keep.any(0).nonzero()
        self.len += int(cols.max()) + 1 if cols.numel() else 0

    def room(self, r):
        """Before a call of r rows: if they would pass the limit, move each sample's kept slots to the
        front (in place: a captured graph reads these very tensors)."""
        if self.len + r > self.limit:
            idx = torch.sort((~self.valid).to(torch.uint8), dim=1, stable=True).indices    # (B, S) kept first
            for buf in self.k + self.v:
                buf.copy_(buf.gather(2, idx[:, None, :, None].expand_as(buf)))
            self.valid.copy_(self.valid.gather(1, idx))
            self.len = int(self.valid.sum(1).max())
            if self.len + r > self.limit:
                raise RuntimeError(f"per-sample cache: {self.len} kept + {r} rows > {self.limit} slots")


def stepper_device(model, mode):
    """The model's device, after checking that a stepper can run there in this mode."""
    if mode not in STEPPERS:
        raise ValueError(f"stepper must be one of {', '.join(STEPPERS)}, got {mode!r}")
    dev = next(model.parameters()).device
    if mode == 'cuda_graph' and dev.type != 'cuda':
        raise ValueError(f"stepper='cuda_graph' needs the model on a CUDA device (it is on {dev}); "
                         "use 'static' or 'dynamic'")
    return dev


def capture_graph(fn, dev, pool):
    """fn() captured as a CUDA graph: (graph, fn's output tensors, which each replay rewrites). fn must
    read its inputs from, and write its outputs to, tensors that outlive the graph."""
    # Autocast's weight-cast cache would hand the graph tensors freed after capture: disable it.
    ac, adt = torch.is_autocast_enabled('cuda'), torch.get_autocast_dtype('cuda')
    actx = lambda: torch.autocast('cuda', dtype=adt, enabled=ac, cache_enabled=False)  # noqa: E731
    # Warm up on a side stream first (lazy inits, cuBLAS/attention setup): replays must find them done.
    side = torch.cuda.Stream(device=dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side), actx():
        for _ in range(2):
            fn()
    torch.cuda.current_stream(dev).wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=pool), actx():
        out = fn()
    return g, out


class SlotStepper:
    """One decoder call of the KV-cached samplers: r slot rows in (r - k pending slots, then k copies of
    the last revealed slot, each with its own target), logits (B, k, V) of the copies out. The caller then
    commits what the cache keeps (stepper.cache.keep): the pending slots and one copy.

    mode 'dynamic': model.forward_slots at the call's own shape, attending over exactly L + r slots.
    'static': rows padded by rows_for, spans by span_for (kv_bucket 0: the whole cache, one span); more
        arithmetic for the same samples (bench/sample_roofline.py counts how much).
    'cuda_graph': 'static', each (padded rows, span) shape captured once and then replayed. All graphs
        share one memory pool, which is safe because one graph's output is consumed (lm_head) before any
        other graph is replayed.
    lm_head and the token draws run outside the graph, on just the k copies.
    A stepper serves many runs (the samplers take one for `stepper` and empty its cache, see make), so
    the graphs are captured once per padded shape, not once per batch; for_batch(b) is its sibling for
    another batch size, made once and kept (the threshold sampler decodes one sample at a time).
    cache: the KVCache it runs on (RowStepper's RowCache); by default one of block_size slots.
    """

    def __init__(self, model, batch_size, mode='dynamic', kv_bucket=KV_BUCKET, cache=None):
        dev = stepper_device(model, mode)
        if kv_bucket < 0 or kv_bucket % 16:
            raise ValueError(f"kv_bucket must be 0 (the whole cache) or a positive multiple of 16 (the SDPA mask "
                             f"alignment), got {kv_bucket}")
        self.model, self.mode, self.B, self.dev, self.kv_bucket = model, mode, batch_size, dev, kv_bucket
        self.cache = KVCache(model, batch_size) if cache is None else cache
        self.siblings = {batch_size: self}
        if mode != 'dynamic':
            self.scalars = torch.zeros(3, dtype=torch.long, device=dev)  # L, blk, r: read at replay
            self.bufs, self.inners, self.graphs, self.outs = {}, {}, {}, {}
            self.pool = torch.cuda.graph_pool_handle() if mode == 'cuda_graph' else None
        if mode == 'cuda_graph':
            # A call's scalars go up from pinned buffers, asynchronously: a copy from pageable memory waits
            # for the GPU to finish everything queued, so the host could never run ahead of the replays.
            # Each buffer is rewritten only after the copy that last read it is done (its event).
            self.staging = [(torch.zeros(3, dtype=torch.long, pin_memory=True), torch.cuda.Event())
                            for _ in range(4)]
            self.turn = 0

    @classmethod
    def make(cls, model, batch_size, stepper, **kw):
        """A fresh stepper for a mode name (or another kind of stepper's mode), or the given stepper
        emptied for a new run. kw: a fresh one's other arguments (RowStepper's slots)."""
        if not isinstance(stepper, cls):
            return cls(model, batch_size, getattr(stepper, 'mode', stepper), **kw)
        if stepper.model is not model or stepper.B != batch_size:
            raise ValueError(f"this {type(stepper).__name__} was built for another model or batch size ({stepper.B})")
        stepper.cache.keep(None)
        return stepper

    def for_batch(self, batch_size):
        """A stepper of this model and mode for another batch size: made on first use, then reused."""
        if batch_size not in self.siblings:
            self.siblings[batch_size] = SlotStepper(self.model, batch_size, self.mode, self.kv_bucket)
            self.siblings[batch_size].siblings = self.siblings
        return self.siblings[batch_size]

    @staticmethod
    def rows_for(r):
        """The padded row count for r rows: the next of 1, 2, 3, 4, 6, 8, 12, ... (under 1.5 r). Two sizes
        per octave pad far fewer token-passes than powers of two, for a few more shapes (graphs) per run
        (bench/sample_roofline.py counts both)."""
        R = 1 << (r - 1).bit_length()
        return R * 3 // 4 if R >= 4 and r <= R * 3 // 4 else R

    @staticmethod
    def span_for(L, R, S, kv_bucket):
        """The slots a fixed-shape call attends over: L cached + R padded rows, rounded up to kv_bucket,
        at most the whole cache S (kv_bucket 0: always S). Every row a real row writes is inside it.
        Why spans: most calls see a short live cache, and reading all of it in every call would make
        K/V reads dominate (bench/sample_roofline.py's second table)."""
        return S if not kv_bucket else min(S, -(-(L + R) // kv_bucket) * kv_bucket)

    def __call__(self, tok, pos, tgt, k, n_logits=None, inner=None):
        """Logits (B, n_logits, V) of the last n_logits rows: by default the k copies' (the speculative
        sampler's verify call asks for every causal row's). inner (r, r) bool, if given, is which of the
        call's rows each row sees, in place of the pending-then-parallel pattern (k is then unused): the
        fused speculative call hangs draft copies off several rows of one causal chain."""
        B, r = tok.shape
        L = self.cache.len
        nl = k if n_logits is None else n_logits
        if self.mode == 'dynamic':
            if L + r > self.model.config.block_size:
                raise ValueError(f"KV cache overflow: {L} cached + {r} new rows > block_size "
                                 f"{self.model.config.block_size}")
            # causal after the cache, the last k rows a parallel block; one row, or a first causal call,
            # needs no mask
            if inner is not None:
                mask = torch.cat([inner.new_ones(r, L), inner], 1)
            else:
                mask = parallel_mask(r, k, L, tok.device) if r > 1 and (k > 1 or L) else None
            kv = self.cache, torch.arange(L, L + r, device=tok.device), L + r
            return self.model.forward_slots(tok, pos, tgt, mask=mask, kv=kv, n_logits=nl)
        R = self.rows_for(r)
        key = R, self.span_for(L, R, self.cache.shape[2], self.kv_bucket), inner is not None
        if R not in self.bufs:
            self.bufs[R] = torch.empty(3, B, R, dtype=torch.long, device=self.dev)
        buf = self.bufs[R]                                                # (3, B, R): tok, pos, tgt
        buf[:, :, :r] = torch.stack([tok, pos, tgt])
        buf[:, :, r:] = buf[:, :, r - 1:r]                                # padding: repeat the last row
        if inner is not None:
            if R not in self.inners:
                self.inners[R] = torch.zeros(R, R, dtype=torch.bool, device=self.dev)
            self.inners[R].zero_()  # no real row sees a padding row; a padding row sees slot 0 (visible)
            self.inners[R][:r, :r] = inner
        if self.mode == 'static':
            self.scalars.copy_(torch.tensor([L, r - k, r]))
            h = self._forward(*key)
        else:
            host, done = self.staging[self.turn % len(self.staging)]
            self.turn += 1
            done.synchronize()                                            # its last copy has finished
            host[0], host[1], host[2] = L, r - k, r
            self.scalars.copy_(host, non_blocking=True)
            done.record()
            if key not in self.graphs:
                self._capture(*key)
            self.graphs[key].replay()
            h = self.outs[key]
        return self.model.lm_head(h[:, r - nl:r])                         # (B, nl, V)

    def visible(self, R, span, tree=False):
        """The fixed-shape call's mask (R, span) and the slots its rows write (R,); see _forward. tree:
        the rows see each other as the call's inner mask says (self.inners[R]), placed at slots L.."""
        L, blk, r = self.scalars
        S = self.cache.shape[2]
        i = torch.arange(R, device=self.dev)[:, None]                    # (R, 1) row
        j = torch.arange(span, device=self.dev)[None, :]                 # (1, span) cache slot
        if tree:
            rel = (j - L).expand(R, span)                                 # (R, span) row index of a slot
            among = self.inners[R].gather(1, rel.clamp(0, R - 1)) & (rel >= 0) & (rel < R)
            vis = (j < L) | among | ((i >= r) & (j == 0))
        else:
            vis = (j < L + torch.minimum(i + 1, blk)) | (j == L + i) | ((i >= r) & (j == 0))   # (R, span)
        return vis, (L + i[:, 0]).clamp(max=S - 1)

    def _forward(self, R, span, tree=False):
        """The fixed-shape call: final-norm hidden states (B, R, C) of R rows (blk pending slots, then
        r - blk copies, then padding), with L, blk and r read from device tensors, so that a captured
        graph reads their values at replay. Every row attends over the first `span` cache slots under a
        mask (no shape depends on L itself): a pending row sees the cache and the pending rows up to
        itself, a copy sees the cache, the pending rows and itself, a padding row the same plus slot 0:
        never an empty softmax, which some kernels turn into 0 and others into NaN, and a NaN anywhere in
        the cache poisons every row through 0 * NaN. Real rows are written at L + i; padding rows past
        the buffer share its last (scratch) slot, which no real row ever sees. tree: the call's own
        inner mask among its rows instead (visible)."""
        buf = self.bufs[R]
        vis, input_pos = self.visible(R, span, tree)
        return self.model.hidden_slots(buf[0], buf[1], buf[2], mask=vis, kv=(self.cache, input_pos, span))

    def _capture(self, R, span, tree):
        if self.cache.k is None:  # the K/V dtype is what c_attn returns: the autocast dtype or the weights'
            ac = torch.is_autocast_enabled('cuda')
            self.cache.allocate(self.dev, torch.get_autocast_dtype('cuda') if ac
                                else next(self.model.parameters()).dtype)
        # The warm-up calls write the same K/V rows the replay will, so they change nothing.
        key = R, span, tree
        self.graphs[key], self.outs[key] = capture_graph(lambda: self._forward(R, span, tree), self.dev, self.pool)


class RowStepper(SlotStepper):
    """A SlotStepper whose samples commit different rows (the speculative sampler's per-sample commits):
    its cache is a RowCache of `slots` slots, and every call first makes room in it (compacting) and
    masks out, per sample, the slots that sample did not keep. 'dynamic' runs each call at its own shape
    under RowCache.mask; the fixed shapes ('static', 'cuda_graph') read the same per-sample mask from a
    device tensor updated in place (so a replayed graph reads the current one), on a buffer one scratch
    slot longer, 16-aligned. The caller commits with stepper.cache.commit(keep (B, r))."""

    def __init__(self, model, batch_size, mode, slots, kv_bucket=KV_BUCKET):
        fixed = mode != 'dynamic'
        cache = RowCache(model, batch_size, KVCache.slots(slots) if fixed else slots, stepper_device(model, mode),
                         scratch=fixed)
        super().__init__(model, batch_size, mode, kv_bucket, cache=cache)

    def __call__(self, tok, pos, tgt, k, n_logits=None, inner=None):
        """SlotStepper's call (the last k rows a parallel block, or inner (r, r): which of the call's rows
        each row sees), over each sample's own kept slots."""
        self.cache.room(tok.size(1))
        if self.mode != 'dynamic':
            return super().__call__(tok, pos, tgt, k, n_logits, inner)
        L, r = self.cache.len, tok.size(1)
        inner = parallel_mask(r, k, 0, tok.device) if inner is None else inner
        kv = self.cache, torch.arange(L, L + r, device=tok.device), L + r
        return self.model.forward_slots(tok, pos, tgt, mask=self.cache.mask(inner), kv=kv,
                                        n_logits=k if n_logits is None else n_logits)

    def _forward(self, R, span, tree=False):
        # SlotStepper's fixed-shape mask, and each sample's kept slots among the cached ones
        buf, L = self.bufs[R], self.scalars[0]
        vis, input_pos = self.visible(R, span, tree)                     # (R, span), (R,)
        j = torch.arange(span, device=self.dev)
        vis = vis & ((j >= L) | self.cache.valid[:, :span])[:, None]     # (B, R, span)
        return self.model.hidden_slots(buf[0], buf[1], buf[2], mask=vis[:, None], kv=(self.cache, input_pos, span))


class EncoderStepper:
    """The encoder MDM's forward pass, (B, n) ids -> final-norm hidden states (B, n, C). Its shape never
    changes, so 'cuda_graph' captures it once and replays it at every step: the graphed encoder is the
    fair baseline for the graphed AO sampler (bench/sample_speed.py). 'static' runs the same plumbing
    (a fixed input buffer) eagerly, which is what the CPU tests check."""

    def __init__(self, model, batch_size, n, mode='dynamic'):
        dev = stepper_device(model, mode)
        self.model, self.mode, self.B, self.n = model, mode, batch_size, n
        self.x = torch.empty(batch_size, n, dtype=torch.long, device=dev) if mode != 'dynamic' else None
        self.graph = self.out = None
        self.pool = torch.cuda.graph_pool_handle() if mode == 'cuda_graph' else None
        self.dev = dev

    @classmethod
    def make(cls, model, batch_size, n, stepper):
        if not isinstance(stepper, EncoderStepper):
            return cls(model, batch_size, n, stepper)
        if stepper.model is not model or (stepper.B, stepper.n) != (batch_size, n):
            raise ValueError(f"this EncoderStepper was built for another model or shape ({stepper.B}, {stepper.n})")
        return stepper

    def __call__(self, x):
        if self.mode == 'dynamic':
            return self.model.encoder_hidden(x)
        self.x.copy_(x)
        if self.mode == 'static':
            return self.model.encoder_hidden(self.x)
        if self.graph is None:
            self.graph, self.out = capture_graph(lambda: self.model.encoder_hidden(self.x), self.dev, self.pool)
        self.graph.replay()
        return self.out
