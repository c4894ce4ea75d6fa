"""
The samplers' settings, checked when they are made: Sampling (the token draw, the schedule, threshold, until:
every sampler's one settings object), the encoder MDM's EncoderPlan, and the table of which sampler reads which
setting (SAMPLERS). The samplers themselves are in generate.py and speculative.py.
"""

if __name__ == '__main__':  # run as a script (python aogpt/samplers.py): one line, not an ImportError
    raise SystemExit("error: aogpt/samplers.py is a library module, with nothing to run: the commands are train.py, "
                     "sample.py, eval_ppl.py, eval_harness.py and export.py at the repository's root")

import math
from dataclasses import dataclass, fields

import torch

from aogpt.errors import UserError


# ----------------------------------------------------------------------------- the settings

def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _whole(v):
    return isinstance(v, int) and not isinstance(v, bool)


# Each setting: whether a value is valid, and what a valid one is (the line a bad one gets)
RULES = dict(temperature=(lambda v: _number(v) and v >= 0, "a number >= 0 (0: greedy)"),
             top_p=(lambda v: _number(v) and 0 < v <= 1, "the nucleus mass, in (0, 1]"),
             vocab_size=(lambda v: v is None or _whole(v) and v >= 1, "None or an integer >= 1"),
             generator=(lambda v: v is None or isinstance(v, torch.Generator), "None or a torch.Generator"),
             schedule=(lambda v: v in ('linear', 'cosine'), "'linear' or 'cosine'"),
             fixed_counts=(lambda v: isinstance(v, bool), "True or False"),
             threshold=(lambda v: _number(v) and 0 <= v <= 1, "a probability in [0, 1] (0: the counts)"),
             until=(lambda v: v is None or _whole(v) and v >= 0, "None or a token id >= 0"))
DRAW = ('temperature', 'top_p', 'vocab_size', 'generator')  # the token draw: every sampler reads these


@dataclass(frozen=True)
class Sampling:
    """How every sampler here and the speculative sampler draw: one object, checked once, passed whole.

    temperature   softmax temperature, >= 0; 0 is greedy (a one-hot on the argmax)
    top_p         the nucleus, in (0, 1]: keep the most likely tokens until their mass reaches top_p (1: all)
    vocab_size    draw only ids below this (the codec's vocabulary; the head may have padding rows); None: all
    generator     the CPU torch.Generator every uniform is drawn from, in each sampler's fixed order (None:
                  torch's global one); one generator fixes the samples on any device
    schedule      the Lemma-1 time grid: 'linear', or 'cosine' (reveals slowly at first)
    fixed_counts  the paper code's deterministic per-step counts instead of the Binomial draws
    threshold     the confidence samplers: each step reveals every masked position whose top probability is at
                  least this (and at least one); 0 takes the counts from the schedule
    until         an end-of-document id, or None: a sample stops once its first document is settled
                  (see settled and each sampler's docstring), -1 where nothing was drawn

    The first four are every sampler's (the token draw, DRAW); the others are read only by the samplers
    SAMPLERS names, and a sampler given one it does not read refuses it rather than ignore it. Change one
    with dataclasses.replace(settings, top_p=0.9).
    """
    temperature: float = 1.0
    top_p: float = 1.0
    vocab_size: int = None
    generator: torch.Generator = None
    schedule: str = 'linear'
    fixed_counts: bool = False
    threshold: float = 0.0
    until: int = None

    def __post_init__(self):
        Sampling.check(**{f.name: getattr(self, f.name) for f in fields(self)})

    @staticmethod
    def invalid(**values):
        """The first of values (field=value) that is not a valid setting, as (field, what a valid one is), or
        None. sample.py asks this of its flags, so that they are checked by these very rules (RULES)."""
        for name, v in values.items():
            ok, rule = RULES[name]
            if not ok(v):
                return name, rule
        return None

    @staticmethod
    def check(**values):
        """Raise UserError, in one line, for the first of values (field=value) that is not a valid setting."""
        bad = Sampling.invalid(**values)
        if bad:
            raise UserError(f"invalid {bad[0]}={values[bad[0]]!r}: {bad[1]}")

    @property
    def transform(self):
        """logits_to_probs' and sample_tokens' keywords: the one transform every draw goes through."""
        return dict(temperature=self.temperature, top_p=self.top_p, vocab_size=self.vocab_size)

    def rand(self, *shape):
        """Float64 uniforms (*shape) from the generator, on the CPU: the draws every sampler consumes."""
        return torch.rand(*shape, dtype=torch.float64, generator=self.generator)


MDM_COUNTS = ('shared', 'independent')  # EncoderPlan.counts: one count per step for the batch, or MDLM's per position


@dataclass(frozen=True)
class EncoderPlan:
    """The encoder MDM's own settings (generate_mdm), checked when made; the token draw and the schedule are
    the Sampling's, as for every sampler.

    counts       'shared': one Binomial count per step for the whole batch and a random order per sample,
                 exactly generate_ao's plan (same seed, same revealed positions and uniforms). 'independent':
                 MDLM's sampler, every position of every sample draws its own reveal time (only with the
                 random order and random counts). Both are the exact reverse process per sample; with
                 'independent' a step reveals nothing only if it does so for every sample, so the caching
                 trick saves far fewer passes at large batch sizes.
    cache_trick  MDLM's ddpm_cache: a step whose input did not change since the last pass reuses it. The
                 pass is deterministic, so this changes the cost, never the samples.
    """
    counts: str = 'shared'
    cache_trick: bool = False

    def __post_init__(self):
        if self.counts not in MDM_COUNTS:
            raise ValueError(f"counts must be 'shared' or 'independent', got {self.counts!r}")
        if not isinstance(self.cache_trick, bool):
            raise ValueError(f"cache_trick must be True or False, got {self.cache_trick!r}")


# ----------------------------------------------------------------------------- the table

SCORES = ('confidence', 'margin', 'entropy')  # the confidence samplers (LLaDA's, Dream's): how sure of a drawn token
COUNTS = ('steps', 'schedule', 'fixed_counts')  # the Lemma-1 counts, which a confidence sampler's threshold replaces


@dataclass(frozen=True)
class Sampler:
    """One row of SAMPLERS: the model a sampler needs, the line when it has another, the settings it reads
    besides the token draw's (DRAW, every sampler's), and in words what it does (why a setting it does not
    read has no use there)."""
    needs: object
    lacks: str
    reads: tuple
    does: str


def _any_order(m):
    return m.config.causal and m.any_order


_CONFIDENT = "needs an any-order decoder (AO-GPT or sigma-GPT): it scores every masked position on the exact KV cache"

# The one table of the samplers (generate.py's, speculative.py's): each sampler's prologue refuses a setting it does
# not read (unread), and sample.py each such flag given on its command line, so no run looks as if it used a
# setting it never read. The settings: steps (an argument), Sampling's fields, the encoder's EncoderPlan fields
# (counts, cache_trick), and the speculative sampler's Speculation (speculation).
SAMPLERS = dict(
    ao=Sampler(_any_order, "generate_ao needs an any-order decoder (cond='adaln' or 'sigma'); use generate_ar for a "
               "GPT and generate_mdm for an encoder", COUNTS + ('until',),
               "reveals the Lemma-1 counts along an order drawn before its first pass"),
    **{score: Sampler(_any_order, f"the {score} sampler {_CONFIDENT}", COUNTS + ('threshold',),
                      f"reveals the masked positions it is surest of ({score}) and draws the whole window")
       for score in SCORES},
    ar=Sampler(lambda m: m.config.causal, "generate_ar needs a decoder; use generate_mdm for an encoder MDM",
               ('until',), "decodes one token per forward call, with no step schedule"),
    mdm=Sampler(lambda m: not m.config.causal, "generate_mdm needs an encoder MDM (causal=False)",
                COUNTS + ('counts', 'cache_trick'), "runs the encoder's full pass per step and draws the whole window"),
    speculative=Sampler(_any_order, "speculative sampling needs an any-order decoder (AO-GPT or sigma-GPT): an encoder "
                        "MDM or an L2R GPT cannot verify drafts in one pass", ('until', 'speculation'),
                        "commits as many tokens per forward call as its drafts earn, with no step schedule"),
)
_WHAT = dict(steps="it sets the Lemma-1 counts", schedule="it sets the Lemma-1 counts",
             fixed_counts="it sets the Lemma-1 counts",
             threshold="it is the confidence samplers' (confidence, margin, entropy) rule for a step's reveals",
             until="it stops a sample early (cut the samples with generate.doc_lengths instead)",
             counts="it is the encoder MDM's", cache_trick="it is the encoder MDM's",
             speculation="it is the speculative sampler's (sample.py --speculative K or auto)")


def unread(sampler, **given):
    """The first of the settings given on purpose (name=value) that `sampler` (a key of SAMPLERS) does not read,
    as (name, why in words), or None. With a threshold a confidence sampler takes no counts: each step reveals
    every position whose top probability reaches it; at temperature 0 no sampler reads top_p."""
    row = SAMPLERS[sampler]
    for name in given:
        if name == 'top_p' and given.get('temperature') == 0:  # the token draw itself, every sampler's
            return name, "at temperature 0 every draw is the argmax, which any nucleus keeps"
        if name in DRAW:
            continue
        if name not in row.reads:
            return name, f"{_WHAT[name]}, and the {sampler} sampler {row.does}"
        if name in COUNTS and 'threshold' in row.reads and given.get('threshold'):
            return name, (f"{_WHAT[name]}, and with threshold {given['threshold']} each step of the {sampler} sampler "
                          f"reveals every masked position whose top probability reaches it (no step schedule)")
    return None
