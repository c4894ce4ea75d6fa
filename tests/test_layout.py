"""The repository's layout as a contract: the commands and model.py at the root, the library in aogpt/,
the findings pipeline in findings/; every module imported under one name only, and the imports layered
(model.py <- aogpt <- the commands; findings and bench on aogpt) with no circle."""
import ast
import importlib.util
import os
import subprocess
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


def _main_block(path):
    """A file's top-level `if __name__ == '__main__':` block, or None."""
    for node in ast.parse(open(path).read(), path).body:
        t = node.test if isinstance(node, ast.If) else None
        if isinstance(t, ast.Compare) and isinstance(t.left, ast.Name) and t.left.id == '__name__' and \
                isinstance(t.comparators[0], ast.Constant) and t.comparators[0].value == '__main__':
            return node
    return None


def _is_guard(block):
    """A __main__ block that only refuses (a module with nothing to run): `raise SystemExit(...)`."""
    return block is not None and len(block.body) == 1 and isinstance(block.body[0], ast.Raise)


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


def test_findings_and_bench_import_the_library_not_a_command():
    """A command is a script around the library: what findings/ and bench/ need of it (the estimators, the
    samplers) lives in aogpt/, so a command's main can change without breaking them."""
    found = [(os.path.relpath(p, ROOT), n) for d in ('findings', 'bench') for p in _sources()
             if os.path.relpath(p, ROOT).startswith(d + os.sep) for n in _imports(p) if n.split('.')[0] in COMMANDS]
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
    scripts += [os.path.relpath(p, ROOT) for p in _sources() if _main_block(p) and not _is_guard(_main_block(p))]
    for rel in sorted(set(scripts)):
        if rel.startswith(('tests', 'bench')):
            continue  # the suite, and measurements (each prints its table as it goes)
        text = open(os.path.join(ROOT, rel)).read()
        if rel == 'train.py':
            assert 'stop_at_safe_points()' in text and 'stop_point()' in text
        else:
            assert 'stop_on_ctrl_c(' in text, rel


def _ours():
    """Every file of aogpt/, bench/, data/ and findings/ but the packages' __init__.py, and whether it is a command
    (a __main__ block that runs something, or a script no other file imports) or a module."""
    imported = {n for p in _sources() for n in _imports(p)}
    for d in ('aogpt', 'bench', 'data', 'findings'):
        for p in _sources():
            rel = os.path.relpath(p, ROOT)
            if not rel.startswith(d + os.sep) or rel.endswith('__init__.py'):
                continue
            names = {rel[:-3].replace(os.sep, '.'), os.path.basename(rel)[:-3]}
            block = _main_block(p)
            yield rel, bool(block and not _is_guard(block)) or not names & imported


def _run(argv, **kw):
    return subprocess.Popen([sys.executable, *argv], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, OMP_NUM_THREADS='1'), **kw)


def test_a_module_run_as_a_script_says_so_in_one_line():
    """`python aogpt/engine.py` puts aogpt/ first on sys.path, where `import aogpt` fails (a ModuleNotFoundError
    traceback). Each module (file or -m) says in one line, before any import, that it has nothing to run and what
    to run instead; none exits 0 silently."""
    modules = [rel for rel, command in _ours() if not command]
    assert 'aogpt/engine.py' in modules and 'bench/common.py' in modules and 'aogpt/plot.py' not in modules
    runs = [(rel, _run([rel, '--help'])) for rel in modules]
    runs += [(rel, _run(['-m', rel[:-3].replace('/', '.')])) for rel in modules if rel.startswith('aogpt/')]
    for rel, p in runs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 1 and not out and err.count('\n') == 1, (rel, err[-500:])
        assert err.startswith(f'error: {rel} ') and 'nothing to run' in err, (rel, err)


@pytest.mark.slow
def test_every_command_answers_help_run_as_a_file_or_a_module():
    """Every command of aogpt/, bench/, data/ and findings/, run as a file (and aogpt's as -m, its documented
    form): --help is the usage on stdout and status 0, never an ImportError."""
    commands = [rel for rel, command in _ours() if command]
    assert {'aogpt/plot.py', 'aogpt/evalsets.py', 'bench/sample_speed.py', 'data/ptb/prepare.py'} <= set(commands)
    runs = [(rel, _run([rel, '--help'])) for rel in commands]
    runs += [(rel, _run(['-m', rel[:-3].replace('/', '.'), '--help'])) for rel in commands if rel.startswith('aogpt/')]
    for rel, p in runs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0 and 'usage' in out.lower() and 'Traceback' not in err, (rel, err[-1000:])


def test_no_module_passes_700_lines():
    """A module here stays one readable file of at most 700 lines (model.py included): past that, an idea moves to a
    room of its own. The tests are exempt (a law parametrized over backbones is one long table)."""
    long = {os.path.relpath(p, ROOT): n for p in _sources() if os.sep + 'tests' + os.sep not in p
            for n in [sum(1 for _ in open(p))] if n > 700}
    assert not long, long


def _functions():
    """(file, qualified name, lines from its def to its last line) of every function outside tests/, methods and
    nested functions included."""
    for p in _sources():
        rel = os.path.relpath(p, ROOT)
        if rel.startswith('tests' + os.sep):
            continue
        tree = ast.parse(open(p).read(), p)
        todo = [(tree, '')]
        while todo:
            node, prefix = todo.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = prefix + child.name
                    if not isinstance(child, ast.ClassDef):
                        yield rel, name, child.end_lineno - child.lineno + 1
                    todo.append((child, name + '.'))
                else:
                    todo.append((child, prefix))


def test_no_function_passes_90_lines():
    """A function outside tests/ reads as one idea of at most 90 lines (from its def to its last line); past
    that, a part of it moves into a function of its own. The tests are exempt, as above."""
    assert any(name == 'hf_source' for _, name, _ in _functions())  # the walk sees the library's functions
    long = {f"{rel}:{name}": n for rel, name, n in _functions() if n > 90}
    assert not long, long


def test_the_readme_stays_at_most_220_lines():
    """README.md is the front door (nanoGPT's is about 230 lines): the detail lives in docs/, the lab notebook in
    results/. 220 lines at most."""
    n = sum(1 for _ in open(os.path.join(ROOT, 'README.md')))
    assert n <= 220, f"README.md has {n} lines: move detail into docs/"


def test_make_help_lists_every_target_with_a_line_and_each_has_a_recipe():
    """`make help` is the Makefile's table of contents: every target declared .PHONY, each with a line saying what
    it does, and every such target has a rule that does something, a recipe or prerequisites (`make bench` was
    declared and had neither)."""
    text = open(os.path.join(ROOT, 'Makefile')).read()
    phony = {t for line in text.splitlines() if line.startswith('.PHONY:') for t in line.split(':', 1)[1].split()}
    lines = text.splitlines()
    for t in phony:
        rule = [i for i, line in enumerate(lines) if line.split(':')[0] == t and not line.startswith('.')]
        prerequisites = rule and lines[rule[0]].split(':', 1)[1].split('#')[0].strip()
        does = rule and (lines[rule[0] + 1].startswith('\t') or prerequisites)
        assert does, f"make {t} has no rule that does anything"
    p = subprocess.run(['make', '-s', 'help'], cwd=ROOT, capture_output=True, text=True, timeout=60)
    listed = {line.split()[1]: line.split(None, 2)[2] for line in p.stdout.splitlines() if line.startswith('  make ')}
    assert p.returncode == 0 and set(listed) == phony and 'help' in phony, (p.stdout, p.stderr)
    assert all(len(d) > 10 for d in listed.values()), listed
