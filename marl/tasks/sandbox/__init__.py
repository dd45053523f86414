"""The code sandbox: run untrusted generated Python against tests so that nothing escapes or hangs.

Pure stdlib, Linux only (namespaces, /proc, memfd, pidfd). Each execution is one `python -I -B -S` child in a
fresh temp dir and a new session, fed by a pool of at most N concurrent executions (SandboxPool).

Prevented (kernel-enforced where noted, which deliberate code cannot undo):
- hangs: the parent's wall clock kills the process group (and, below, every process of the uid); CPU rlimit;
- memory bombs: RLIMIT_AS (MemoryError → 'oom'); huge files: RLIMIT_FSIZE; fd exhaustion: RLIMIT_NOFILE;
- fork bombs: fork/exec/subprocess/multiprocessing are disabled in the harness; RLIMIT_NPROC caps the tasks
  (threads included) of the child's own uid (kernel, when the child has its own uid or the parent is not
  root: root ignores RLIMIT_NPROC); leftovers are killed by process group and by uid;
- network: a new network namespace with no interfaces up (kernel; needs CAP_SYS_ADMIN, reported as
  network_isolation='namespace'); always also a Python-level socket block ('harness' when it is the only one);
- files: when the parent is root the child drops to a fresh uid (reported as user_isolation='uid'), so file
  permissions bind it: it cannot delete or write root's files or read private ones, nor signal, trace or read
  the environment of other processes; what it creates at the top of /tmp, /var/tmp, /dev/shm is deleted
  afterwards;
- secrets: the environment is scrubbed to PATH/LANG/HOME/TMPDIR;
- flooding output: stdout/stderr are read incrementally and the child is killed past the cap;
- faked passes: the verdict travels on a separate fd with a per-execution nonce and is written only after
  the last test; tests use builtins saved before the candidate ran and compare plain-data return values;
  stdin/stdout outputs are compared in the parent, which alone holds the expected outputs.

Not prevented: reading world-readable files (the source tree, /etc); without root, file access is the
parent user's; without CAP_SYS_ADMIN, deliberate code can bypass the Python-level socket block; deliberate
introspection of the harness (frames, gc, ctypes) can find the nonce; disk use is bounded per file, not in
total; unprivileged user namespaces are left to the kernel's policy.
"""

from marl.tasks.sandbox.limits import REASONS, STYLES, Program, SandboxLimits, SandboxResult
from marl.tasks.sandbox.pool import SandboxPool
from marl.tasks.sandbox.runner import compare_outputs, normalize_output, run

__all__ = [
    "REASONS", "STYLES", "Program", "SandboxLimits", "SandboxPool", "SandboxResult", "compare_outputs",
    "normalize_output", "run",
]
