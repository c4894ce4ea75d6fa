"""Issue #50: the verdicts that lean on a seed spread take it from every seed of a findings script's seeds
setting (4 by default), not from two. The runs of the first two seeds keep their names and commands (finished
runs are reused); --extend adds seeds to finding 9's record by training only the new seeds' compared runs; each
report says which verdicts changed against the record it replaces."""
import json
import math
from types import SimpleNamespace

import pytest

from findings import judging as J
from findings import optimizers as OPT
from findings import orders as O
from findings import report
from findings import reproduce as R


def test_finding3_judges_the_means_against_the_seed_range():
    # 10% L2R lower by 0.05 and 0.06 on the means; the seeds' largest range 0.04: reproduced
    v, ev = J.judge_better_seeds([('L2R loss', [1.00, 1.02, 1.04, 1.02], [1.06, 1.07, 1.08, 1.07]),
                                  ('any-order loss', [2.00, 2.01, 2.02, 2.01], [2.06, 2.07, 2.08, 2.07])])
    assert v == 'reproduced' and '1.070 ± 0.010 -> 1.020 ± 0.020' in ev and 'over 4 seeds' in ev
    # the same means, one wild seed widens the range to 0.10: within noise
    v, ev = J.judge_better_seeds([('L2R loss', [0.97, 1.07, 1.02, 1.02], [1.06, 1.07, 1.08, 1.07])])
    assert v == 'not reproduced' and '(within noise)' in ev and '0.100' in ev
    assert J.judge_better_seeds([('L2R loss', [1.0], [1.1])])[0] == 'reproduced'  # one seed: the sign only


def test_verdict_changes_name_what_changed():
    assert 'none to compare with' in report.verdict_changes({}, {'3': 'reproduced'})
    text = report.verdict_changes({'3': 'reproduced', '5a': 'reproduced', '1': 'x'},
                                  {'1': 'x', '3': 'not reproduced', '5a': 'reproduced', '9': 'met'})
    assert text == ('Verdicts against the previous record: 3: reproduced -> **not reproduced**; unchanged: 1, 5a; '
                    'new: 9.')
    assert report.verdict_changes({'3': 'a'}, {'3': 'a'}) == 'Verdicts against the previous record: none changed.'


def test_previous_verdicts_read_an_old_record_or_none(tmp_path):
    p = tmp_path / 'results.json'
    pick = lambda r: {f['id']: f['verdict'] for f in r['findings']}  # noqa: E731
    assert report.previous_verdicts(str(p), pick) == {}
    p.write_text(json.dumps(dict(findings=[dict(id='3', verdict='reproduced')])))
    assert report.previous_verdicts(str(p), pick) == {'3': 'reproduced'}
    p.write_text('{"findings": 3}')
    assert report.previous_verdicts(str(p), pick) == {}
