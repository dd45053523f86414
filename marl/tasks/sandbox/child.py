"""The sandbox's child side: confine this process, run one candidate's tests, report the verdict.

`marl.tasks.sandbox.runner` starts this file as `python -I -B [-S] child.py <result_fd>` in a fresh session
and temp dir; the package never imports it (it runs on the stdlib alone). The order is the security model:

1. Read the whole payload (marshalled by the parent) from stdin while still privileged.
2. Confine: network + IPC namespaces (needs CAP_SYS_ADMIN; without it only step 3 guards the network),
   rlimits (CPU, address space, file size, open files, tasks, no core), no-new-privileges, and, when root,
   a fresh uid, so file permissions, RLIMIT_NPROC and signal permissions bind the candidate.
3. Disable process creation, sockets and tracing at the Python level: a second line that deliberate code
   can bypass (re-importing a C module), which is why steps 2 and the parent's kill-by-uid exist.
4. Run the candidate and its tests (child_runs.py); report on the result fd as '<nonce> <kind> <json>' lines.

Only a 'done' record carrying the nonce counts, and the harness writes it after the last test ran: prints,
exit codes, sys.exit and os._exit cannot fake a pass. Tests run against builtins saved before the candidate
ran, and the candidate's return values are converted to plain data first, so patched builtins or
always-equal objects cannot fake one either. Not defended: deliberate introspection of this process
(frames, gc, ctypes) to find the nonce; the threat is generated code, not an adversary.
"""

# Only built-in and extension modules: json, signal and friends import re and enum, which would double
# the interpreter's start-up; the payload arrives marshalled and records are written by _dumps below.
import _json
import _signal as signal
import builtins
import marshal
import os
import resource
import sys

CLONE_NEWNET, CLONE_NEWIPC = 0x40000000, 0x08000000
PR_SET_NO_NEW_PRIVS = 38
RLIMITS = {
    "cpu_s": resource.RLIMIT_CPU,
    "memory_bytes": resource.RLIMIT_AS,
    "file_bytes": resource.RLIMIT_FSIZE,
    "open_files": resource.RLIMIT_NOFILE,
    "processes": resource.RLIMIT_NPROC,
    "core_bytes": resource.RLIMIT_CORE,
}
PROCESS_CALLS = (
    "fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp", "execv", "execve", "execl", "execle",
    "execlp", "execlpe", "execvp", "execvpe", "spawnv", "spawnve", "spawnvp", "spawnvpe", "spawnl", "spawnle",
    "spawnlp", "spawnlpe",
)
RUNS = "child_runs.py"  # the test runners, beside this file


def main() -> None:
    payload = marshal.loads(sys.stdin.buffer.read())
    send = _sender(int(sys.argv[1]), payload["nonce"])
    runs = _load_runs()  # while still privileged: the package may sit where the sandbox uid cannot read
    isolation = _confine(payload)
    end_descendants = _descendant_killer(isolation["user"] == "uid")
    send("setup", isolation)
    pristine = dict(builtins.__dict__)  # taken before any candidate code runs
    streams = (sys.stdout, sys.stderr)
    run = runs["run_functional"] if payload["style"] == "functional" else runs["run_stdio"]
    try:
        verdict = run(payload, pristine)
    except MemoryError:
        verdict = {"status": "oom", "detail": "MemoryError in the harness"}
    runs["restore_builtins"](pristine)  # the candidate ran last inside the tests
    _flush(streams)  # os._exit below skips it, and the parent's output cap must see everything printed
    send("done", verdict)
    end_descendants()
    os._exit(0)  # skip atexit hooks and joins of threads the candidate left behind


def _descendant_killer(own_uid):
    """A function that kills and waits for every other process of this uid, for a child under its own uid
    (else a no-op: kill(-1) as a shared uid would hit unrelated processes). Run before exiting, while this
    process still ignores SIGCHLD, so the kernel reaps what the candidate forked instead of leaving zombies
    to a PID 1 that may not reap. References are taken before the candidate runs."""
    kill, wait, sigkill = os.kill, os.wait, signal.SIGKILL

    def end():
        if not own_uid:
            return
        try:
            kill(-1, sigkill)  # Linux spares the caller; the uid is this execution's alone
            wait()  # with SIGCHLD ignored: returns (ECHILD) once every child has gone
        except OSError:
            pass

    return end


def _flush(streams):
    for stream in streams:
        try:
            stream.flush()
        except BaseException:  # closed or broken by the candidate: nothing left to deliver
            pass


def _load_runs():
    """child_runs.py's functions, loaded by path while still privileged and kept out of sys.modules, so the
    candidate cannot reach (and patch) their globals with an import."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), RUNS)
    namespace = {"__name__": "sandbox_runs", "__builtins__": builtins}
    with open(path, encoding="utf-8") as f:
        exec(compile(f.read(), path, "exec"), namespace)
    return namespace


def _sender(fd, nonce):
    """A writer bound to references taken now, so a candidate patching os or builtins cannot redirect it."""
    write, dumps, view_of = os.write, _dumps, memoryview

    def send(kind, body):
        view = view_of(f"{nonce} {kind} {dumps(body)}\n".encode("utf-8", "replace"))
        while view:
            view = view[write(fd, view):]

    return send


def _dumps(value, quote=_json.encode_basestring, kind=type, text=repr, string=str):
    """JSON for the verdict's value types (None, bool, int, float, str, list, dict with str keys). The
    builtins it needs are bound as defaults now: a thread the candidate left running could patch them."""
    if value is None or value is True or value is False:
        return {None: "null", True: "true", False: "false"}[value]
    if kind(value) in (int, float):
        return text(value)
    if kind(value) is str:
        return quote(value)
    if kind(value) in (list, tuple):
        return "[" + ",".join(_dumps(v) for v in value) + "]"
    return "{" + ",".join(f"{quote(string(k))}:{_dumps(v)}" for k, v in value.items()) + "}"


def _confine(payload):
    libc = _libc()
    network = "namespace" if libc is not None and libc.unshare(CLONE_NEWNET) == 0 else "harness"
    if libc is not None:
        libc.unshare(CLONE_NEWIPC)  # SysV IPC objects then die with the process; best effort
    uid = payload["uid"]
    dropping = uid is not None and os.geteuid() == 0
    if dropping:
        _reach_prefixes_by_fd()
    for key, (soft, hard) in payload["rlimits"].items():
        resource.setrlimit(RLIMITS[key], (soft, hard))
    if libc is not None:
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # setuid binaries cannot hand privileges back
    # Children the candidate manages to create anyway are reaped by the kernel the moment they die, so
    # killing them from the parent leaves no zombies behind (see reaper.kill_group_and_uid).
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    _block_processes()
    _block_sockets()
    sys.settrace = sys.setprofile = _refuse("tracing")  # a trace hook could jump over a test's asserts
    return {"network": network, "user": _drop_to(uid) if dropping else "none"}


def _libc():
    """The C library, for unshare(2) and prctl(2) (os.unshare needs Python 3.12); None where it lacks them."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
    except (ImportError, OSError):
        return None
    return libc if hasattr(libc, "unshare") and hasattr(libc, "prctl") else None


def _reach_prefixes_by_fd():
    """Point sys.path at /proc/self/fd/<dir fd> for the interpreter's prefixes.

    The interpreter may live under a directory the dropped uid cannot traverse (/root is 0700). A directory
    fd opened now, while root, is reached through the magic link without traversing its ancestors; only
    the prefix tree itself (world-readable in any usable install) becomes importable, nothing beside it."""
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    links = {p: f"/proc/self/fd/{os.open(p, os.O_RDONLY | os.O_DIRECTORY)}" for p in prefixes}

    def relink(path):
        for prefix in sorted(links, key=len, reverse=True):
            if path == prefix or path.startswith(prefix + "/"):
                return links[prefix] + path[len(prefix):]
        return path

    sys.path[:] = [relink(p) for p in sys.path]
    for module in list(sys.modules.values()):
        path = getattr(module, "__path__", None)
        if isinstance(path, list):
            path[:] = [relink(p) for p in path]
    sys.path_importer_cache.clear()


def _drop_to(uid):
    try:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    except OSError:  # e.g. the uid is not mapped in this user namespace: stay, and say so
        return "none"
    return "uid"


def _refuse(what):
    def refuse(*args, **kwargs):
        raise PermissionError(f"{what} is disabled in the sandbox")

    return refuse


def _block_processes():
    import _posixsubprocess
    import posix

    for module in (os, posix):
        for name in PROCESS_CALLS:
            if hasattr(module, name):
                setattr(module, name, _refuse("process creation"))
    _posixsubprocess.fork_exec = _refuse("process creation")  # what subprocess and multiprocessing use


def _block_sockets():
    import _socket

    class RefusedSocket(_socket.socket):
        __slots__ = ()  # socket.socket adds __weakref__ itself when it subclasses this

        def __init__(self, *args, **kwargs):
            raise PermissionError("network access is disabled in the sandbox")

    # socket.socket subclasses whatever _socket.socket is when `socket` is first imported.
    _socket.socket = _socket.SocketType = RefusedSocket
    _socket.socketpair = _refuse("network access")


if __name__ == "__main__":
    main()
