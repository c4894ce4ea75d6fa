"""The repository's layout as a contract: the commands and model.py at the root, the library in aogpt/,
the findings pipeline in findings/; every module imported under one name only, and the imports layered
(model.py <- aogpt <- the commands <- findings, bench) with no circle."""
import ast
import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = {'train', 'sample', 'eval_ppl', 'eval_harness', 'export'}
LIBRARY = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, 'aogpt')) if f.endswith('.py') and f != '__init__.py')
FINDINGS = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, 'findings')) if f.endswith('.py') and f != '__init__.py')


def _sources():
    for d, dirs, files in os.walk(ROOT):
        dirs[:] = [x for x in dirs if not x.startswith('.') and x != '__pycache__' and not x.startswith('out')]
        for f in files:
            if f.endswith('.py'):
                yield os.path.join(d, f)


def _imports(path):
    """Every module name a file imports, at the top or inside a function, and in code held in strings
    that tests run with `python -c` is out of reach (the bare-import test below catches those at run time)."""
    names = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def test_the_root_holds_the_commands_and_the_model():
    """A new library module belongs in aogpt/, not beside the commands (the front door stays a dozen entries)."""
    at_root = {f[:-3] for f in os.listdir(ROOT) if f.endswith('.py')}
    assert at_root == COMMANDS | {'model'}, sorted(at_root)


@pytest.mark.parametrize('name', LIBRARY + FINDINGS + ['findings_sampling'])
def test_a_moved_module_has_no_bare_name(name):
    """`import engine` must fail: a module importable as both `engine` and `aogpt.engine` would be two module
    objects, and a monkeypatch of one would silently miss the other."""
    assert ROOT in sys.path
    assert importlib.util.find_spec(name) is None, f"{name} is importable without its package"


def test_no_file_imports_a_library_module_by_its_bare_name():
    bare = set(LIBRARY) | set(FINDINGS) | {'findings_sampling'}
    found = [(os.path.relpath(p, ROOT), n) for p in _sources() for n in _imports(p) if n.split('.')[0] in bare]
    assert not found, found


def test_imports_are_layered_with_no_circle():
    """model.py imports nothing of ours; aogpt/ imports only model and aogpt (never a command, the findings,
    bench or data); and the graph among aogpt's modules has no cycle, lazy imports included."""
    upward = COMMANDS | {'findings', 'bench', 'data', 'tests'}
    assert not {n.split('.')[0] for n in _imports(os.path.join(ROOT, 'model.py'))} & (upward | {'aogpt'})
    graph = {}
    for m in LIBRARY:
        names = _imports(os.path.join(ROOT, 'aogpt', f'{m}.py'))
        assert not {n.split('.')[0] for n in names} & upward, (m, sorted(names))
        graph[m] = {n.split('.')[1] for n in names if n.startswith('aogpt.') and n.split('.')[1] in LIBRARY}
    done, path = set(), []

    def visit(m):
        assert m not in path, f"import circle: {' -> '.join(path[path.index(m):] + [m])}"
        if m in done:
            return
        path.append(m)
        for d in sorted(graph[m]):
            visit(d)
        path.pop()
        done.add(m)
    for m in LIBRARY:
        visit(m)


def test_every_command_ends_a_ctrl_c_or_sigterm_with_one_line():
    """Each script a user runs installs configurator.stop_on_ctrl_c (one line, exit 130 or 143, cleanups
    run) or, train.py, its form stop_at_safe_points (the run ends at its next safe point); without one a Ctrl-C is
    a traceback of 50 lines (reproduce.py's wait loop, eval_harness.py inside lm-eval) and a SIGTERM a silent death."""
    scripts = [f'{c}.py' for c in COMMANDS] + ['data/ptb/prepare.py', 'data/text/prepare.py',
                                                'data/openwebtext/prepare.py']
    scripts += [os.path.relpath(p, ROOT) for p in _sources() if "__name__ == '__main__'" in open(p).read()
                or '__name__ == "__main__"' in open(p).read()]
    for rel in sorted(set(scripts)):
        if rel.startswith(('tests', 'bench')):
            continue  # the suite, and measurements (each prints its table as it goes)
        text = open(os.path.join(ROOT, rel)).read()
        if rel == 'train.py':
            assert 'stop_at_safe_points()' in text and 'stop_point()' in text
        else:
            assert 'stop_on_ctrl_c(' in text, rel
