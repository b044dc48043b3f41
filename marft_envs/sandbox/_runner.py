"""Sandbox runner, executed as a script (``python -I _runner.py MODE ...``).

Self-contained on purpose (stdlib only, no marft imports): it runs inside the
sandbox, where the package may not be importable and must not be trusted.

Two modes:

* ``stub`` (untrusted side, runs the program): hardens its own process
  (mount namespace made read-only except the work dir when asked, capabilities
  dropped, rlimits, a seccomp filter that blocks internet sockets, signals to
  other processes, ptrace and friends), closes every fd it does not need, then
  executes the program. With ``--serve`` it then answers calls
  ``name(*args)`` from the checker over two pipes, with arguments and results
  marshalled as plain data (see ``encode``/``decode``).
* ``checker`` (trusted side, never runs program code): executes the test code
  in its own process, where every name the program defines is a proxy that
  calls into the stub. Values come back decoded into genuine builtins, so
  ``==`` in an ``assert`` is Python's own; the verdict of each test unit is
  streamed to the grader on a pipe only the checker holds.
"""

from __future__ import annotations

import builtins
import json
import numbers
import os
import select
import struct
import sys
import time

MAX_FRAME = 16 * 1024 * 1024  # bytes; a larger reply counts as a crash
MAX_DEPTH = 200
MAX_ITEMS = 1_000_000  # elements taken from a returned iterator
MAX_HELLO_VALUE = 64 * 1024  # bytes; larger program constants are not exported


# --------------------------------------------------------------------------- codec
class Opaque:
    """A value the program returned that has no plain-data form: equal to nothing."""

    __slots__ = ("type_name", "text")

    def __init__(self, type_name: str, text: str) -> None:
        self.type_name, self.text = type_name, text

    def __eq__(self, other: object) -> bool:
        return other is self

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return f"<unserializable {self.type_name}: {self.text}>"


def encode(x, depth: int = 0):
    """Plain-data tagged JSON form of ``x`` (bool/int/str/None stay JSON scalars)."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    d = depth + 1
    if x is None or type(x) is bool or type(x) is str:
        return x
    if type(x) is int:
        return x
    if type(x) is float:
        return {"f": float.hex(x)}
    if isinstance(x, bool):
        return bool(x)
    if isinstance(x, str):
        return str.__str__(x)
    if type(x) is list or type(x) is tuple or isinstance(x, (list, tuple)):
        tag = "t" if isinstance(x, tuple) else "l"
        return {tag: [encode(v, d) for v in x]}
    if isinstance(x, dict):
        return {"d": [[encode(k, d), encode(v, d)] for k, v in dict.items(x)]}
    if isinstance(x, frozenset):
        return {"F": [encode(v, d) for v in x]}
    if isinstance(x, set):
        return {"s": [encode(v, d) for v in x]}
    if isinstance(x, (bytes, bytearray)):
        return {"b": bytes(x).hex()}
    if isinstance(x, numbers.Integral):
        return int(x)
    if isinstance(x, numbers.Real):
        return {"f": float.hex(float(x))}
    if isinstance(x, numbers.Complex):
        c = complex(x)
        return {"c": [float.hex(c.real), float.hex(c.imag)]}
    if isinstance(x, range):
        return {"r": [x.start, x.stop, x.step]}
    if hasattr(x, "tolist") and callable(x.tolist):  # numpy arrays/scalars
        return encode(x.tolist(), d)
    if hasattr(x, "__next__") and hasattr(x, "__iter__"):  # map, filter, generators
        items = []
        for v in x:
            if len(items) >= MAX_ITEMS:
                raise ValueError("iterator too long")
            items.append(encode(v, d))
        return {"it": items}
    try:
        text = repr(x)[:200]
    except Exception:
        text = "?"
    return {"o": [type(x).__name__, text]}


def decode(x, depth: int = 0):
    """Inverse of ``encode``; builds only builtin objects (or ``Opaque``)."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    d = depth + 1
    if x is None or isinstance(x, (bool, int, str)):
        return x
    if isinstance(x, float):  # not produced by encode, but harmless
        return x
    if not isinstance(x, dict) or len(x) != 1:
        raise ValueError("malformed value")
    (tag, v), = x.items()
    if tag == "f":
        return float.fromhex(v)
    if tag == "l":
        return [decode(e, d) for e in v]
    if tag == "t":
        return tuple(decode(e, d) for e in v)
    if tag == "d":
        return {decode(k, d): decode(e, d) for k, e in v}
    if tag == "s":
        return {decode(e, d) for e in v}
    if tag == "F":
        return frozenset(decode(e, d) for e in v)
    if tag == "b":
        return bytes.fromhex(v)
    if tag == "c":
        return complex(float.fromhex(v[0]), float.fromhex(v[1]))
    if tag == "r":
        return range(int(v[0]), int(v[1]), int(v[2]))
    if tag == "it":  # an iterator stays an iterator (a map object != a list)
        return iter([decode(e, d) for e in v])
    if tag == "o":
        return Opaque(str(v[0]), str(v[1]))
    raise ValueError(f"unknown tag {tag!r}")


# ------------------------------------------------------------------------ framing
def send(fd: int, obj) -> None:
    """Write one length-prefixed JSON frame to ``fd`` (loops over short writes)."""
    data = json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()
    data = struct.pack(">I", len(data)) + data
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                raise TimeoutError
        b = os.read(fd, min(n - got, 1 << 20))
        if not b:
            return None
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


def recv(fd: int, deadline: float | None = None):
    """One frame, or None at EOF. Raises TimeoutError / ValueError (bad frame)."""
    head = _read_exact(fd, 4, deadline)
    if head is None:
        return None
    (n,) = struct.unpack(">I", head)
    if n > MAX_FRAME:
        raise ValueError("frame too large")
    body = _read_exact(fd, n, deadline)
    if body is None:
        return None
    return json.loads(body)


# ------------------------------------------------------------- stub: hardening
_SYSCALLS = {  # name -> (x86_64, aarch64)
    "socket": (41, 198),
    "kill": (62, 129),
    "tkill": (200, 130),
    "tgkill": (234, 131),
    "rt_sigqueueinfo": (129, 138),
    "rt_tgsigqueueinfo": (297, 240),
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "pidfd_open": (434, 434),
    "pidfd_send_signal": (424, 424),
    "pidfd_getfd": (438, 438),
    "io_uring_setup": (425, 425),
    "bpf": (321, 280),
    "setsid": (112, 157),
    "setpgid": (109, 154),
    "mount_setattr": (442, 442),
    "shmget": (29, 194),
    "semget": (64, 190),
    "msgget": (68, 186),
    "mq_open": (240, 180),
}
_ARCH = {"x86_64": (0, 0xC000003E), "aarch64": (1, 0xC00000B7)}


def _libc():
    # deferred: the stdlib-only runner starts once per program run; each mode loads what it calls
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def install_seccomp(block_setsid: bool, block_ipc: bool = False) -> None:
    """Kernel-enforced: only AF_UNIX sockets; no signals to other processes, no
    ptrace/process_vm/pidfd/io_uring/bpf; optionally no setsid/setpgid (so the
    process group that the grader kills holds every descendant) and no SysV/POSIX
    IPC objects (``block_ipc``: without an IPC namespace they would outlive the run)."""
    # deferred: the stdlib-only runner starts once per program run; each mode loads what it calls
    import ctypes

    machine = os.uname().machine
    if machine not in _ARCH:
        raise OSError(f"seccomp filter not built for {machine}")
    col, audit_arch = _ARCH[machine]
    nr = {k: v[col] for k, v in _SYSCALLS.items()}
    EPERM, EACCES = 1, 13
    ALLOW, ERRNO = 0x7FFF0000, 0x00050000
    LD, JEQ, JGE, RET = 0x20, 0x15, 0x35, 0x06
    me = os.getpid()
    deny = ["ptrace", "process_vm_readv", "process_vm_writev", "pidfd_open",
            "pidfd_send_signal", "pidfd_getfd", "io_uring_setup", "bpf", "mount_setattr"]
    if block_setsid:
        deny += ["setsid", "setpgid"]
    if block_ipc:
        deny += ["shmget", "semget", "msgget", "mq_open"]
    pid_checked = ["kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"]
    # (code, jt_label, jf_label, k); labels resolved to relative offsets below
    prog: list[tuple] = [("ld", LD, None, None, 4),
                         ("", JEQ, None, "deny", audit_arch),
                         ("", LD, None, None, 0)]
    if machine == "x86_64":
        prog.append(("", JGE, "deny", None, 0x40000000))  # x32 ABI
    prog += [("", JEQ, "deny", None, nr[s]) for s in deny]
    prog.append(("", JEQ, "sock", None, nr["socket"]))
    prog += [("", JEQ, "pid", None, nr[s]) for s in pid_checked]
    prog.append(("allow", RET, None, None, ALLOW))
    prog += [("sock", LD, None, None, 16),
             ("", JEQ, "ok", None, 1),  # AF_UNIX
             ("", RET, None, None, ERRNO | EACCES),
             ("pid", LD, None, None, 16),
             ("", JEQ, "ok", None, 0),
             ("", JEQ, "ok", None, me),
             ("", JEQ, "ok", None, (-me) & 0xFFFFFFFF),
             ("deny", RET, None, None, ERRNO | EPERM),
             ("ok", RET, None, None, ALLOW)]  # BPF jumps only forward
    where = {lab: i for i, (lab, *_rest) in enumerate(prog) if lab}

    class SockFilter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte),
                    ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

    arr = (SockFilter * len(prog))()
    for i, (_lab, code, jt, jf, k) in enumerate(prog):
        arr[i] = SockFilter(code, where[jt] - i - 1 if jt else 0,
                            where[jf] - i - 1 if jf else 0, k)
    fprog = SockFprog(len(prog), arr)
    libc = _libc()
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS failed")
    if libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:  # PR_SET_SECCOMP, FILTER
        raise OSError(ctypes.get_errno(), "seccomp filter refused")


class _MountAttr:  # filled lazily: ctypes is imported inside the functions
    cls = None


def _setattr(path: str, attr_set: int, attr_clr: int, recursive: bool) -> None:
    """``mount_setattr`` on the mount at ``path`` (and its submounts if ``recursive``)."""
    # deferred: the stdlib-only runner starts once per program run; each mode loads what it calls
    import ctypes

    if _MountAttr.cls is None:
        class MountAttr(ctypes.Structure):
            _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                        ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]
        _MountAttr.cls = MountAttr
    nr = _SYSCALLS["mount_setattr"][_ARCH[os.uname().machine][0]]
    attr = _MountAttr.cls(attr_set, attr_clr, 0, 0)
    if _libc().syscall(nr, -100, path.encode(), 0x8000 if recursive else 0,
                       ctypes.byref(attr), 32) != 0:
        raise OSError(ctypes.get_errno(), f"mount_setattr {path}")


def new_root(workdir: str, spec: dict) -> None:
    """In a private mount namespace: build an empty root holding only ``spec["roots"]``
    (read-only), the work dir (writable), a private /tmp, /dev and /proc; cover the
    package dirs ``spec["hidden"]`` with empty tmpfs; chroot into it. Test data and
    data sets elsewhere on the host (site-packages, a checkout, a data dir) are gone."""
    # deferred: the stdlib-only runner starts once per program run; each mode loads what it calls
    import ctypes

    libc = _libc()
    RDONLY, NOSUID, NODEV, BIND, REC, PRIVATE = 1, 2, 4, 4096, 16384, 1 << 18
    at = spec["at"]
    size = int(spec.get("tmpfs_bytes") or 64 << 20)

    def mount(src, dst: str, fstype, flags: int, data: str | None = None) -> None:
        rc = libc.mount(None if src is None else src.encode(), dst.encode(),
                        None if fstype is None else fstype.encode(), flags,
                        None if data is None else data.encode())
        if rc != 0:
            raise OSError(ctypes.get_errno(), f"mount {src} on {dst}")

    def inside(p: str) -> str:
        q = at + p
        os.makedirs(q, exist_ok=True)
        return q

    mount(None, "/", None, REC | PRIVATE)
    mount("tmpfs", at, "tmpfs", NOSUID | NODEV, "mode=0755,size=1m")
    for r in spec["roots"]:
        mount(r, inside(r), None, BIND | REC)
        _setattr(at + r, 1 | 2, 0, recursive=True)  # MOUNT_ATTR_RDONLY | NOSUID
    for link, target in spec.get("links", []):
        os.symlink(target, at + link)
    for h in spec.get("hidden", []):
        if os.path.isdir(at + h):
            mount("tmpfs", at + h, "tmpfs", RDONLY | NOSUID | NODEV, "mode=0755,size=4k")
    mount("tmpfs", inside("/tmp"), "tmpfs", NOSUID | NODEV, f"mode=1777,size={size}")
    mount(workdir, inside(workdir), None, BIND)
    mount("/proc", inside("/proc"), None, BIND | REC)
    mount("tmpfs", inside("/dev"), "tmpfs", NOSUID, f"mode=0755,size={size}")
    for dev in ("null", "zero", "full", "random", "urandom"):
        open(at + "/dev/" + dev, "w").close()
        mount("/dev/" + dev, at + "/dev/" + dev, None, BIND)
    os.mkdir(at + "/dev/shm", 0o1777)
    os.chmod(at + "/dev/shm", 0o1777)
    os.symlink("/proc/self/fd", at + "/dev/fd")
    _setattr(at, 1 | 2, 0, recursive=False)  # the skeleton itself is read-only
    os.chroot(at)
    os.chdir(workdir)


def _drop_bounding_set(libc: ctypes.CDLL) -> None:  # noqa: F821  (ctypes is imported lazily)
    """Empty the capability bounding set: no capability comes back through an exec."""
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
    except OSError:
        last = 40
    for cap in range(last + 1):
        libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP (errors ignored: already gone)


def drop_capabilities() -> None:
    """Empty the bounding, effective, permitted and inheritable sets (no regain on exec)."""
    # deferred: the stdlib-only runner starts once per program run; each mode loads what it calls
    import ctypes

    libc = _libc()
    _drop_bounding_set(libc)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)
    data = (ctypes.c_uint32 * 6)()
    if libc.capset(ctypes.byref(header), ctypes.byref(data)) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def drop_to_user(workdir: str, uid: int, gid: int) -> list[int]:
    """Root without namespaces: give ``workdir`` to ``uid:gid`` and become that user for
    good (no supplementary groups, no capabilities, no_new_privs). File permissions
    then protect the host, and ``/proc/<pid>/environ`` of root processes (the grader's
    secrets) is unreadable. Returns the fds kept open for the import path."""
    # deferred: the stdlib-only runner starts once per program run; each mode loads what it calls
    import ctypes

    libc = _libc()
    for root, dirs, files in os.walk(workdir):
        for name in [root] + [os.path.join(root, n) for n in dirs + files]:
            os.chown(name, uid, gid, follow_symlinks=False)
    # sys.path dirs the new user cannot search (a Python under /root, mode 0700) stay
    # reachable through O_PATH fds opened now; nothing else under them becomes readable.
    path_fds = {}
    for p in sys.path:
        if p and p not in path_fds and os.path.isdir(p):
            path_fds[p] = os.open(p, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    _drop_bounding_set(libc)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS: setuid binaries inert
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS failed")
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    try:
        os.setuid(0)
    except PermissionError:
        pass
    else:
        raise OSError("could regain uid 0 after dropping privileges")
    if os.geteuid() != uid or os.getegid() != gid or os.getgroups():
        raise OSError("privilege drop incomplete")
    moved = {p: f"/proc/self/fd/{fd}" for p, fd in path_fds.items()
             if not os.access(p, os.R_OK | os.X_OK)}
    sys.path[:] = [moved.get(p, p) for p in sys.path]
    for mod in list(sys.modules.values()):  # packages already imported (collections, ...)
        search = getattr(mod, "__path__", None)
        if isinstance(search, list):
            search[:] = [_moved_path(p, moved) for p in search]
    kept = [path_fds[p] for p in moved]
    for fd in set(path_fds.values()) - set(kept):
        os.close(fd)
    return kept


def _moved_path(path: str, moved: dict[str, str]) -> str:
    for old, new in moved.items():
        if path == old or path.startswith(old.rstrip("/") + "/"):
            return new + path[len(old.rstrip("/")):]
    return path


# Landlock filesystem rights (uapi/linux/landlock.h).
_LL_EXECUTE, _LL_READ_FILE, _LL_READ_DIR = 1 << 0, 1 << 2, 1 << 3
_LL_WRITE_FILE, _LL_TRUNCATE = 1 << 1, 1 << 14
_LL_DIR_WRITES = sum(1 << b for b in range(4, 13))  # remove_*, make_* (ABI 1)
_LL_REFER = 1 << 13  # ABI 2


def landlock_workdir(workdir: str, reads: list | None = None) -> bool:
    """Kernel-enforced (Landlock, Linux >= 5.13, no privileges needed): writes, creates,
    deletes and renames only beneath ``workdir`` (and writes to /dev/null), even in
    world-writable places such as /tmp that a uid drop leaves open. With ``reads``
    (``[path, kind]``, kind ``"tree"``: read anything beneath, ``"list"``: list
    directories only, ``"file"``: read that file), reads and executes are confined to
    those paths and the work dir too: the interpreter's stdlib stays readable, data
    sets in site-packages or elsewhere do not. It does not hide
    ``/proc/<pid>/environ`` (measured): the uid drop and a non-dumpable grader do that.
    False (nothing done) where the kernel lacks Landlock."""
    # deferred: the stdlib-only runner starts once per program run; each mode loads what it calls
    import ctypes

    libc = _libc()
    abi = libc.syscall(444, None, 0, 1)  # landlock_create_ruleset(VERSION)
    if abi < 1:
        return False
    handled = _LL_WRITE_FILE | _LL_DIR_WRITES
    if abi >= 2:
        handled |= _LL_REFER
    if abi >= 3:
        handled |= _LL_TRUNCATE
    read_file = _LL_READ_FILE | _LL_EXECUTE
    rules: list[tuple[str, int]] = [
        (workdir, handled), ("/dev/null", handled & (_LL_WRITE_FILE | _LL_TRUNCATE))]
    if reads is not None:
        handled |= read_file | _LL_READ_DIR
        rules = [(workdir, handled),
                 ("/dev/null", _LL_READ_FILE | (handled & (_LL_WRITE_FILE | _LL_TRUNCATE)))]
        rules += [(d, _LL_READ_FILE) for d in ("/dev/zero", "/dev/urandom", "/dev/random")]
        kinds = {"tree": read_file | _LL_READ_DIR, "list": _LL_READ_DIR, "file": read_file}
        rules += [(str(path), kinds[kind]) for path, kind in reads]

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    attr = ctypes.c_uint64(handled)  # struct landlock_ruleset_attr, fs field only
    ruleset = libc.syscall(444, ctypes.byref(attr), ctypes.sizeof(attr), 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        for path, access in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:
                continue  # e.g. no /dev/random in a minimal container
            try:
                rule = PathBeneath(access, fd)
                if libc.syscall(445, ruleset, 1, ctypes.byref(rule), 0) != 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule {path} failed")
            finally:
                os.close(fd)
        if libc.prctl(38, 1, 0, 0, 0) != 0:  # restrict_self needs no_new_privs
            raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS failed")
        if libc.syscall(446, ruleset, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)
    return True


def set_limits(lim: dict) -> None:
    """Apply the rlimits in ``lim`` (None skips one; never above the current hard limit)."""
    # deferred: the stdlib-only runner starts once per program run; each mode loads what it calls
    import resource

    def setl(which: int, value: int | None) -> None:
        if value is None:
            return
        soft, hard = resource.getrlimit(which)
        v = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (v, v))

    setl(resource.RLIMIT_CORE, 0)
    setl(resource.RLIMIT_CPU, lim.get("cpu"))
    setl(resource.RLIMIT_FSIZE, lim.get("fsize"))
    setl(resource.RLIMIT_NPROC, lim.get("nproc"))
    setl(resource.RLIMIT_NOFILE, lim.get("nofile"))
    setl(resource.RLIMIT_AS, lim.get("as"))


def _fatal(code: int, msg: str) -> None:
    os.write(2, f"[marft-sandbox] {msg}\n".encode())
    os._exit(code)


def _extend_path(paths: list) -> None:
    for p in paths or []:
        if isinstance(p, str) and p not in sys.path:
            sys.path.append(p)


def stub_main(cfg: dict) -> None:
    """Untrusted side: harden this process, run the program, then serve the checker's calls."""
    _extend_path(cfg.get("sys_path"))
    keep = [cfg.get("req"), cfg.get("resp")]
    try:
        # deferred: loaded here, before any privilege drop can hide them (stub mode only)
        import ctypes  # noqa: F401
        import resource  # noqa: F401

        if cfg.get("new_root"):
            new_root(cfg["workdir"], cfg["new_root"])
        if cfg.get("drop_caps"):
            drop_capabilities()
        if cfg.get("landlock"):  # before the uid drop: its rules open paths under /root
            landlock_workdir(cfg["workdir"], cfg["landlock"].get("reads"))
        if cfg.get("drop_to"):
            keep += drop_to_user(cfg["workdir"], *cfg["drop_to"])
        set_limits(cfg["limits"])
        if cfg.get("seccomp", True):
            install_seccomp(block_setsid=cfg.get("block_setsid", False),
                            block_ipc=cfg.get("block_ipc", False))
        os.chdir(cfg["workdir"])
    except Exception as e:  # the grader treats this as an infrastructure failure
        _fatal(97, f"setup failed: {type(e).__name__}: {e}")
    keep_fds = sorted(fd for fd in keep if fd is not None)
    lo = 3
    for fd in keep_fds + [1 << 20]:
        os.closerange(lo, min(fd, 1 << 16))
        lo = fd + 1
    with open(cfg["program"], encoding="utf-8") as f:
        source = f.read()
    ns = {"__name__": cfg.get("module_name", "__main__"), "__builtins__": builtins}
    sys.argv = ["program.py"]
    if not cfg.get("serve"):
        exec(compile(source, "program.py", "exec"), ns)
        return
    req, resp = cfg["req"], cfg["resp"]
    try:
        exec(compile(source, "program.py", "exec"), ns)
    except Exception as e:
        send(resp, {"ok": False, "exc": type(e).__name__, "msg": str(e)[:500]})
        return
    hello = []
    for name, value in list(ns.items()):
        if name.startswith("__") or type(value).__name__ == "module":
            continue
        if callable(value):
            hello.append([name, "callable", None])
        else:
            try:
                enc = encode(value)
                if len(json.dumps(enc, allow_nan=False)) <= MAX_HELLO_VALUE:
                    hello.append([name, "value", enc])
            except Exception:
                continue
    send(resp, {"ok": True, "names": hello})
    while True:
        msg = recv(req)
        if msg is None:
            return
        try:
            fn = ns[msg["name"]]
            args = [decode(a) for a in msg["args"]]
            kwargs = {k: decode(v) for k, v in msg["kwargs"].items()}
            out = {"ok": True, "value": encode(fn(*args, **kwargs))}
        except Exception as e:
            out = {"ok": False, "exc": type(e).__name__, "msg": str(e)[:500]}
        send(resp, out)


# ------------------------------------------------------------------ checker side
class ProgramGone(BaseException):
    """The program exited, crashed or broke the protocol (a BaseException so
    that a test's ``except Exception`` cannot swallow it)."""


class DeadlineExceeded(BaseException):
    """The run's wall-clock budget is spent."""


class ProgramError(Exception):
    """The program raised an exception that is not a builtin one."""


class _Link:
    def __init__(self, req: int, resp: int, deadline: float) -> None:
        self.req, self.resp, self.deadline, self.dead = req, resp, deadline, ""
        self.calls, self.timed_out = 0, False

    def recv(self):
        if self.dead:
            raise ProgramGone(self.dead)
        try:
            msg = recv(self.resp, self.deadline)
        except TimeoutError:
            self.dead, self.timed_out = "deadline exceeded", True
            raise DeadlineExceeded(self.dead) from None
        except (ValueError, OSError, RecursionError, MemoryError) as e:
            self.dead = f"protocol error: {type(e).__name__}: {e}"
            raise ProgramGone(self.dead) from None
        if msg is None or not isinstance(msg, dict):
            self.dead = "program exited"
            raise ProgramGone(self.dead)
        return msg

    def call(self, name: str, args: tuple, kwargs: dict):
        if self.dead:
            raise ProgramGone(self.dead)
        self.calls += 1
        try:
            send(self.req, {"name": name, "args": [encode(a) for a in args],
                            "kwargs": {k: encode(v) for k, v in kwargs.items()}})
        except OSError:
            self.dead = "program exited"
            raise ProgramGone(self.dead) from None
        msg = self.recv()
        if msg.get("ok") is True:
            try:
                return decode(msg.get("value"))
            except (ValueError, TypeError, KeyError, IndexError, AttributeError,
                    RecursionError) as e:
                self.dead = f"malformed reply: {e}"
                raise ProgramGone(self.dead) from None
        exc_name, text = str(msg.get("exc")), str(msg.get("msg"))[:500]
        cls = getattr(builtins, exc_name, None)
        if isinstance(cls, type) and issubclass(cls, Exception):
            try:
                raise cls(text)
            except TypeError:  # e.g. UnicodeDecodeError needs 5 args
                pass
        raise ProgramError(f"{exc_name}: {text}")


def _proxy(link: _Link, name: str):
    def proxy(*args, **kwargs):
        return link.call(name, args, kwargs)

    proxy.__name__ = proxy.__qualname__ = name
    return proxy


def checker_main(req: int, resp: int, out: int) -> None:
    """Trusted side: run the test units against proxies of the program's names and report
    each verdict, HMAC-signed, on ``out``."""
    # deferred: the stdlib-only runner starts once per program run; each mode loads what it calls
    import hashlib
    import hmac
    import resource

    spec = json.loads(sys.stdin.buffer.read())
    _extend_path(spec.get("sys_path"))
    try:  # keep same-uid processes out of /proc/<checker>/{mem,fd} (fallback level)
        _libc().prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
    except OSError:
        pass
    key = bytes.fromhex(spec["key"])
    seq = [0]
    mem = spec.get("checker_memory")
    if mem:
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    deadline = time.monotonic() + float(spec["timeout"])
    units: list[str] = spec["units"]
    link = _Link(req, resp, deadline)

    def report(obj) -> None:
        # Authenticated and numbered: a frame injected into the grader's pipe (e.g.
        # through /proc/<grader>/fd without namespaces) fails the check.
        obj["seq"] = seq[0]
        seq[0] += 1
        body = json.dumps(obj, sort_keys=True, separators=(",", ":"))
        mac = hmac.new(key, body.encode(), hashlib.sha256).hexdigest()
        send(out, {"body": body, "mac": mac})

    try:
        hello = link.recv()
    except (ProgramGone, DeadlineExceeded) as e:
        hello = {"ok": False, "exc": type(e).__name__, "msg": str(e)}
    ns: dict = {"__name__": "__marft_tests__", "__builtins__": builtins}
    entry = spec.get("entry_point")
    if hello.get("ok") is True:
        for item in hello.get("names", []):
            try:
                name, kind, value = item
                if not isinstance(name, str) or not name.isidentifier():
                    continue
                if name in vars(builtins) and name != entry:
                    continue  # a program's ``len`` must not answer the test's len()
                ns[name] = _proxy(link, name) if kind == "callable" else decode(value)
            except (ValueError, TypeError, RecursionError):
                continue
        report({"event": "loaded"})
    else:
        link.dead = f"program failed to load: {hello.get('exc')}: {hello.get('msg')}"
        report({"event": "load_failed", "error": link.dead})
    if entry:
        ns[spec.get("candidate_name") or "candidate"] = _proxy(link, entry)
    setup_error = None
    if spec.get("setup"):
        try:
            exec(compile(spec["setup"], "<test setup>", "exec"), ns)
        except BaseException as e:  # noqa: BLE001 - reported, never raised
            setup_error = f"test setup failed: {type(e).__name__}: {e}"
    for i, unit in enumerate(units):
        t0 = time.monotonic()
        error = setup_error or (link.dead or None)
        if error is None:
            try:
                exec(compile(unit, f"<test {i}>", "exec"), ns)
            except AssertionError as e:
                error = f"AssertionError: {e}"[:500] if str(e) else "AssertionError"
            except BaseException as e:  # noqa: BLE001
                error = f"{type(e).__name__}: {e}"[:500]
        report({"event": "test", "index": i, "passed": error is None, "error": error,
                "duration": time.monotonic() - t0})
    report({"event": "done", "calls": link.calls, "timed_out": link.timed_out})


def main() -> None:
    """Dispatch ``stub``/``checker`` from the command line."""
    mode = sys.argv[1]
    if mode == "stub":
        arg = sys.argv[2]
        if arg.startswith("@"):  # a file the grader wrote: read, then delete (the program must not)
            with open(arg[1:], encoding="utf-8") as f:
                cfg = json.load(f)
            os.unlink(arg[1:])
        else:
            cfg = json.loads(arg)
        stub_main(cfg)
    elif mode == "checker":
        checker_main(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
