"""The sandbox's test runners: run a candidate against functional tests or stdin/stdout cases and return the
harness's verdict ({'status': ..., 'detail': ...}).

Loaded by child.py in the child while still privileged, never imported by the package. Everything here runs
in the candidate's process, so builtins are restored from the copy taken before the candidate ran whenever
harness code runs again, and the values the candidate returns are converted to plain data before a test
compares them.
"""

import _signal
import builtins
import fcntl
import os
import sys
import time

DETAIL_CHARS = 500
# Bound now: the candidate may patch the time and _signal modules.
monotonic, set_timer, set_handler = time.monotonic, _signal.setitimer, _signal.signal
ALARM, REAL_TIMER = _signal.SIGALRM, _signal.ITIMER_REAL


class TestTimeLimit(BaseException):
    """Raised into the candidate by the per-test alarm; a BaseException, so
    `except Exception` lets it pass."""


def _expire(signum, frame):
    raise TestTimeLimit()


def _limited(action, seconds):
    """`action()` (a verdict or None) with a wall limit of `seconds` per test (0 = none), the paper's per-test
    alarm: SIGALRM raises TestTimeLimit into the running code, and a test that swallowed it and still ended
    past its limit is timed out all the same (a test that never ends meets the parent's wall clock)."""
    if not seconds:
        return action()
    timeout = {"status": "timeout", "detail": f"over the {seconds:g} s per-test limit"}
    set_handler(ALARM, _expire)
    start = monotonic()
    set_timer(REAL_TIMER, seconds)
    try:
        failure = action()
    except TestTimeLimit:
        failure = timeout
    finally:
        set_timer(REAL_TIMER, 0)
    return timeout if monotonic() - start >= seconds else failure


def _describe(error):
    try:
        return f"{type(error).__name__}: {error}"[:DETAIL_CHARS]
    except BaseException:  # a candidate's exception can fail even to print itself
        return type(error).__name__


def _attempt(action, exit_ok=False):
    """None when `action` finished; else the failure verdict. Catches everything the candidate can raise."""
    try:
        action()
    except SystemExit as e:
        if exit_ok and e.code in (None, 0):
            return None
        return {"status": "failed", "detail": f"exited ({e.code!r}) before the tests finished"[:DETAIL_CHARS]}
    except MemoryError:
        return {"status": "oom", "detail": "MemoryError"}
    except TestTimeLimit:
        return {"status": "timeout", "detail": "over the per-test limit"}
    except BaseException as e:
        return {"status": "failed", "detail": _describe(e)}
    return None


def _compile(source, name):
    try:
        return compile(source, name, "exec"), None
    except BaseException as e:  # SyntaxError, ValueError (NUL bytes), RecursionError / MemoryError (nesting)
        return None, {"status": "syntax_error", "detail": _describe(e)}


def restore_builtins(pristine):
    """Undo the candidate's edits to builtins before the harness's own code runs again."""
    builtins.__dict__.clear()
    builtins.__dict__.update(pristine)


def _module(name):
    """A fresh module for the candidate, registered under `name`; it also replaces this harness as
    __main__, so `import __main__` does not hand the candidate the harness's globals."""
    module = type(sys)(name)
    sys.modules[name] = sys.modules["__main__"] = module
    return module.__dict__


def run_functional(payload, pristine):
    code, failure = _compile(payload["code"], "<solution>")
    prefix, _ = _compile(payload["prefix"], "<prompt>")
    if failure or prefix is None:
        return failure or {"status": "error", "detail": "the task's prefix does not compile"}
    plain = _plain_converter()  # built while builtins are still pristine
    namespace = _module("solution")
    prelude, per_test = payload["prelude"], payload["per_test_s"]
    failure = _limited(lambda: _attempt(lambda: (exec(prelude, namespace), exec(prefix, namespace),
                                                 exec(code, namespace))), per_test)
    restore_builtins(pristine)
    if failure:
        return failure
    tests = dict(namespace)
    tests["__builtins__"] = dict(pristine)  # the tests never see builtins the candidate patched
    failure = _attempt(lambda: exec(payload["test"], tests))
    check, candidate = tests.get("check"), namespace.get(payload["entry_point"])
    if failure or not callable(check):
        return failure or {"status": "error", "detail": "the task's tests define no check(candidate)"}
    if not callable(candidate):
        return {"status": "failed", "detail": f"no function named {payload['entry_point']!r}"[:DETAIL_CHARS]}
    run_check = lambda: _attempt(lambda: check(lambda *a, **k: plain(candidate(*a, **k))))  # noqa: E731
    return _limited(run_check, per_test) or {"status": "ok"}


def _plain_converter():
    """A function turning a return value into exact builtin data (int, float, str, list, dict, ...).

    Subclasses become their base type through the base's own methods (Counter → dict, namedtuple → tuple),
    objects with __index__ (numpy integers) become int; anything else is refused, so an object whose
    __eq__ always says True never reaches a test's comparison. References are taken before the candidate
    runs."""
    exact = {int, float, complex, str, bytes, bool, type(None)}
    containers = ((dict, dict), (list, list), (tuple, tuple), (frozenset, frozenset), (set, set))
    # Each base's own conversion returns an exact copy for a subclass (bytes/complex gained theirs in 3.11).
    scalars = (
        (int, int.__int__),
        (float, float.__float__),
        (str, str.__str__),
        (bytes, getattr(bytes, "__bytes__", bytes)),
        (complex, getattr(complex, "__complex__", complex)),
    )
    kind, is_a, has, items, to_int = type, isinstance, hasattr, dict.items, int.__int__
    index = __import__("operator").index

    def plain(value):
        t = kind(value)
        if t in exact:
            return value
        for base, convert in scalars:
            if is_a(value, base):
                return convert(value)
        for base, make in containers:
            if is_a(value, base):
                if base is dict:
                    return {plain(k): plain(v) for k, v in items(value)}
                return make(plain(v) for v in base.__iter__(value))
        if has(t, "__index__"):
            return to_int(index(value))
        raise TypeError(f"the solution returned a {t.__name__}; tests compare plain values only")

    return plain


def run_stdio(payload, pristine):
    code, failure = _compile(payload["code"], "<solution>")
    if failure:
        return failure
    outputs = []
    for number, data in enumerate(payload["inputs"], start=1):
        output, failure = _run_case(code, data, payload, pristine)
        if failure:
            failure["detail"] = f"case {number}: {failure.get('detail', '')}"[:DETAIL_CHARS]
            return failure
        outputs.append(output)
    return {"status": "ran", "outputs": outputs}


def _run_case(code, data, payload, pristine):
    """Run the program once with `data` on fd 0 and fd 1 captured, after the prelude if any and within the
    per-test limit if any; (stdout text, None) or (None, failure).

    Both are memfds, so `open(0).read()`, `sys.stdin.buffer` and `os.write(1, ...)` behave as in a real run,
    and RLIMIT_FSIZE bounds how much a flooding program writes before the size check below."""
    stdin_fd, stdout_fd = _memfd("stdin"), _memfd("stdout")
    try:
        _write_all(stdin_fd, data.encode("utf-8"))
        os.lseek(stdin_fd, 0, os.SEEK_SET)
        os.dup2(stdin_fd, 0)
        os.dup2(stdout_fd, 1)
        stdout = open(1, "w", encoding="utf-8", closefd=False)  # builtins are pristine here
        sys.stdin = sys.__stdin__ = open(0, encoding="utf-8", closefd=False)
        sys.stdout = sys.__stdout__ = stdout
        namespace = _module("__main__")
        prelude, cap = payload["prelude"], payload["max_output_bytes"]
        failure = _limited(lambda: _program(code, prelude, namespace, pristine), payload["per_test_s"])
        failure = failure or (None if stdout.closed else _attempt(stdout.flush))
        size = os.fstat(stdout_fd).st_size
        if size > cap:
            return None, {"status": "output_limit", "detail": f"more than {cap} bytes on stdout"}
        if failure:
            return None, failure
        return os.pread(stdout_fd, size, 0).decode("utf-8", "replace"), None
    finally:
        for fd in (stdin_fd, stdout_fd):
            try:
                os.close(fd)
            except OSError:  # the program closed it
                pass


def _program(code, prelude, namespace, pristine):
    """One run of a stdio program (after the prelude) and of the threads it left: a verdict or None."""
    failure = _attempt(lambda: (exec(prelude, namespace), exec(code, namespace)), exit_ok=True)
    restore_builtins(pristine)  # the harness's code below and the next case see clean builtins
    return failure or _attempt(_join_threads)


def _memfd(name):
    """A memfd numbered >= 3: fds 0 and 1 belong to the program, which may close them (`open(0)` does)."""
    fd = os.memfd_create(name)
    if fd >= 3:
        return fd
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    os.close(fd)
    return high


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _join_threads():
    """Wait for non-daemon threads, as interpreter exit would (some programs run `main` in a thread)."""
    threading = sys.modules.get("threading")
    if threading is None:
        return
    current = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not current and not thread.daemon:
            thread.join()

