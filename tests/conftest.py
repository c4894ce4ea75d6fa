import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
# Tests never touch the network: HF datasets/hub offline, wandb off.
os.environ.setdefault('HF_DATASETS_OFFLINE', '1')
os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('WANDB_MODE', 'disabled')

import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import BACKBONES  # noqa: E402

torch.set_flush_denormal(True)


def pytest_configure(config):
    # `make test` runs `-m "not slow"`; `make test-all` (what CI runs) runs everything
    config.addinivalue_line('markers', 'slow: an end-to-end check of half a minute or more, or a case of a grid '
                                       'beyond the ones GRIDS keeps (make test-all runs it)')


# The grids: tests parametrized over many settings of one property (a sampler's law, a cache against a
# recomputation) whose cases cost seconds each. make test runs the cases named here, which between them touch every
# value of every parameter; make test-all runs the whole grid. A name here that no longer matches a collected case
# is an error, so the table cannot quietly drop a grid from make test. The backbone fixture's blocks ('paper', 'rope'
# in a case id) are one more parameter: between them the kept cases put every sampler and estimator on the rope block
# at least once; a law that costs seconds keeps its other rope cases, and a negative control its rope case, for
# make test-all.
GRIDS = {
    'test_model.py::test_encoder_elbo_is_unbiased_for_exact_any_order_loss': ('paper',),  # rope: 14 s (the encoder
    # with rotary positions stays in make test through test_encoder_is_bidirectional_and_never_predicts_mask)
    'test_speculative.py::test_l2r_is_the_exact_joint': ('paper-True-2', 'paper-False-4', 'paper-True-3',
                                                         'rope-False-2'),
    'test_speculative.py::test_an_order_distribution_gives_the_mixture_over_its_law': (
        'paper-mix:0.3*l2r+0.7*nearl2r:2.5',),
    'test_speculative.py::test_random_order_is_the_mixture_over_orders': ('paper-per_row',),
    'test_speculative.py::test_prompt_and_infill': ('paper-infill',),
    'test_speculative.py::test_temperature_and_top_p_transform_both_laws': ('paper-tf2',),
    'test_speculative.py::test_cache_equals_a_cache_free_recomputation': ('kw0-cond0', 'kw1-cond1', 'kw2-cond2',
                                                                          'kw3-cond0', 'kw0-cond3'),
    'test_speculative.py::test_static_stepper_gives_the_dynamic_samples': ('paper-kw0-min', 'paper-kw1-per_row',
                                                                           'paper-kw2-fused', 'rope-kw0-fused'),
    'test_speculative.py::test_per_sample_cache_equals_a_cache_free_recomputation': (
        'cond0-kw0', 'cond1-kw1', 'cond0-kw2', 'cond1-kw3', 'cond0-kw4', 'cond2-kw2', 'cond2-kw4'),
    'test_speculative.py::test_fused_rounds_are_the_exact_joint': ('paper-kw0-orders0-4', 'paper-kw3-orders3-4',
                                                                   'paper-kw5-orders5-4', 'paper-kw7-orders7-4',
                                                                   'rope-kw6-orders6-4'),
    # the rope block's speculative laws in make test: the two-call chain above and this fused one (2.7 s); the rest
    # of it (90 s) in make test-all
    'test_speculative.py::test_fixed_permutation_and_batch_minimum': ('paper',),
    'test_speculative.py::test_blocks_order_is_the_mixture_over_its_orders': ('paper',),
    'test_speculative.py::test_l2r_batch_minimum': ('paper',),
    'test_speculative.py::test_one_sample_per_row_equals_batch_minimum': ('paper',),
    'test_speculative.py::test_its_law_is_the_lemma1_samplers_at_one_token_a_step_only': ('paper',),
    'test_speculative.py::test_fused_negative_controls_are_rejected': ('None', 'keep_rejected'),
    'test_sample.py::test_static_stepper_equals_dynamic_call_for_call': ('paper-kw0-0', 'rope-kw1-16', 'paper-kw2-0'),
    'test_sample.py::test_confidence_orders_on_the_cache_equal_a_cache_free_recomputation': (
        'paper-confidence-dynamic', 'rope-margin-static'),
    'test_sample.py::test_encoder_cache_trick_gives_identical_samples_with_fewer_passes': ('paper-shared',
                                                                                          'rope-independent'),
    'test_sample.py::test_one_step_draws_every_position_from_its_first_step_marginal': ('paper',),
    'test_documents.py::test_early_stop_keeps_the_full_draws_documents_token_for_token': ('paper-semiar:2',
                                                                                          'rope-random'),
    'test_documents.py::test_early_stopped_documents_have_the_exact_law': ('paper-semiar:2-True', 'rope-semiar:2-True'),
    'test_documents.py::test_early_stopped_speculative_documents_have_the_exact_law': ('paper-kw0', 'rope-kw0'),
    'test_documents.py::test_a_stop_rule_that_ignores_the_holes_is_rejected': ('paper',),  # a negative control
    'test_eval.py::test_order_bound_is_the_expectation_over_its_law': ('paper-mix:0.3*l2r+0.7*semiar:3',
                                                                       'rope-nearl2r:2.5'),
    'test_eval.py::test_mdm_elbo_matches_enumeration_over_orders': ('paper-count', 'rope-time'),
    'test_eval.py::test_fast_and_exact_ensemble_match_enumeration': ('paper',),  # rope: 1.6 s (the ensemble meets the
    # rope block in make test through test_one_member_reproduces_the_plain_any_order_loss and the nested sizes)
    'test_hub.py::test_the_cards_commands_run_as_written': ('adaln',),
    'test_hub.py::test_an_uncached_hf_id_offline_fails_at_once_in_one_line': ('HF_HUB_OFFLINE',),
    'test_train.py::test_an_export_folder_is_not_a_run_directory': ('resume', 'auto'),
}


@pytest.hookimpl(tryfirst=True)  # before -m reads the markers
def pytest_collection_modifyitems(config, items):
    found = {name: set() for name in GRIDS}
    for item in items:
        name = f"{item.path.name}::{item.originalname}"
        if name in GRIDS and hasattr(item, 'callspec'):
            found[name].add(item.callspec.id)
            if item.callspec.id not in GRIDS[name]:
                item.add_marker(pytest.mark.slow)
    if any('::' in arg for arg in config.args):
        return  # a run of named cases collects only those
    for name, ids in found.items():
        if ids and not set(GRIDS[name]) <= ids:  # (no ids: the file was not collected this time)
            raise pytest.UsageError(f"tests/conftest.py GRIDS: {name} has no case "
                                    f"{sorted(set(GRIDS[name]) - ids)}; its cases are {sorted(ids)}")


@pytest.fixture(scope='module', params=list(BACKBONES))
def backbone(request):
    """The GPTConfig switches of each block a law runs on (helpers.BACKBONES); module-scoped, so a module's own
    model fixtures can build on it. A grid's case ids name it ('paper', 'rope')."""
    return BACKBONES[request.param]


@pytest.fixture
def cli(monkeypatch, capsys):
    """Run sample.main() in-process, each call from the module's default config (main() writes the
    resolved config into the module's globals; they are restored before every call and at the end)."""
    import sample
    defaults = {k: v for k, v in vars(sample).items() if not k.startswith('_') and
                isinstance(v, (int, float, bool, str, type(None)))}
    for k, v in defaults.items():
        monkeypatch.setattr(sample, k, v)

    def run(*args):
        for k, v in defaults.items():
            setattr(sample, k, v)
        monkeypatch.setattr(sys, 'argv', ['sample.py', '--device', 'cpu', '--seed', '1', *args])
        code = 0
        try:
            sample.main()
        except SystemExit as e:
            code = e.code
        out = capsys.readouterr()
        return code, out.out, out.err
    return run

